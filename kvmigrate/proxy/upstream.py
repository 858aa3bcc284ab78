"""One connection pool per backend, and the URL of each upstream call.

Upstream URLs are built only from the config's `api_base`; a request contributes nothing
but a path below `/v1`, which is checked so it cannot climb out of that base.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from urllib.parse import quote

import aiohttp

from kvmigrate.config import BackendConfig, Config
from kvmigrate.proxy.errors import bad_request
from kvmigrate.proxy.replicas import LeasedResponse, ReplicaSet


class Upstream:
    """A backend: its config, its pool, and which replica a conversation goes to."""

    def __init__(self, backend: BackendConfig) -> None:
        self.config = backend
        self.name = backend.name
        key = backend.api_key
        self.replicas = ReplicaSet(
            backend.api_bases,
            probe_headers={"Authorization": "Bearer " + key.reveal()} if key else None,
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
        """`api_base` of the conversation's replica, plus the checked path below /v1.

        Azure OpenAI names the deployment in the path and the API version in the query:
        `{api_base}/openai/deployments/{deployment}/{suffix}?api-version=...`."""
        checked = safe_suffix(suffix)
        base = self.replicas.pick(conversation)
        if self.config.type == "azure" and deployment is not None:
            return (
                f"{base}/openai/deployments/{quote(deployment, safe='')}/{checked}"
                f"?api-version={quote(self.config.api_version or '', safe='')}"
            )
        return base + "/" + checked

    def probe(self) -> tuple[str, dict[str, str]]:
        """URL and headers of a cheap readiness probe: the backend's model list."""
        key = self.config.api_key
        if self.config.type == "azure":
            version = quote(self.config.api_version or "", safe="")
            url = f"{self.config.api_base}/openai/models?api-version={version}"
            return url, ({"api-key": key.reveal()} if key else {})
        return self.url("models"), ({"Authorization": "Bearer " + key.reveal()} if key else {})

    @property
    def key_header(self) -> str:
        """Where this backend expects its key: Azure OpenAI reads `api-key`."""
        return "api-key" if self.config.type == "azure" else "Authorization"

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
