"""One connection pool per backend, and the URL of each upstream call.

Upstream URLs are built only from the config's `api_base`; a request contributes nothing
but a path below `/v1`, which is checked so it cannot climb out of that base.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

import aiohttp

from kvmigrate.config import BackendConfig, Config
from kvmigrate.proxy.errors import bad_request
from kvmigrate.proxy.headers import candidate_allowlist
from kvmigrate.proxy.kinds import kind_of
from kvmigrate.proxy.replicas import LeasedResponse, ReplicaSet


class Upstream:
    """A backend: its config, its pool, and which replica a conversation goes to."""

    def __init__(self, backend: BackendConfig) -> None:
        self.config = backend
        self.name = backend.name
        self.kind = kind_of(backend)
        key = backend.api_key
        # The headers that carry the backend's own key; None: the backend has none.
        self.auth = self.kind.auth_headers(key) if key is not None else None
        # The client headers it sees as a candidate.
        self.candidate_headers = candidate_allowlist(backend.candidate_headers)
        self.replicas = ReplicaSet(
            backend.api_bases, probe_headers=self.auth, probe_url=self.kind.probe_url
        )
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.config.max_connections, keepalive_timeout=30, ttl_dns_cache=300
            )
            timeout = aiohttp.ClientTimeout(
                total=None,
                sock_connect=self.config.connect_timeout,
                sock_read=self.config.read_timeout,
            )
            # Bytes are relayed as they arrive: no decompression, no cookie jar shared
            # between clients.
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=timeout,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent",),
                # In-flight load per replica, for bounded-load routing (see proxy.replicas).
                response_class=LeasedResponse,
                trace_configs=self.replicas.trace_configs(),
            )
        return self._session

    def url(self, suffix: str, conversation: str = "", deployment: str | None = None) -> str:
        """The URL of the checked path below /v1 on the conversation's replica, as the
        backend's kind builds it (Azure names the deployment in the path)."""
        return self.kind.url(self.replicas.pick(conversation), safe_suffix(suffix), deployment)

    def probe(self) -> tuple[str, dict[str, str]]:
        """URL and headers of a cheap readiness probe."""
        return self.kind.probe_url(self.replicas.pick()), dict(self.auth or {})

    async def close(self) -> None:
        await self.replicas.close()
        if self._session is not None:
            await self._session.close()
            self._session = None


def safe_suffix(suffix: str) -> str:
    """Refuse path tricks that could reach another path or host than the configured base."""
    lowered = suffix.lower()
    segments = suffix.split("/")
    if (
        ".." in segments
        or "." in segments
        or "//" in suffix
        or "\\" in suffix
        or "%2f" in lowered
        or "%5c" in lowered
        or "%2e" in lowered
        or "://" in suffix
        or "@" in suffix
        or suffix.startswith("/")
    ):
        raise bad_request(f"Unsupported path: /v1/{suffix}")
    return suffix


class Upstreams:
    """All configured backends, opened lazily and closed together."""

    def __init__(self, config: Config) -> None:
        self._by_name = {name: Upstream(b) for name, b in config.backends.items()}

    def __getitem__(self, name: str) -> Upstream:
        return self._by_name[name]

    async def close(self) -> None:
        await asyncio.gather(*(u.close() for u in self._by_name.values()))

    async def __aenter__(self) -> Upstreams:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
