"""One connection pool per backend, and the URL of each upstream call.

Upstream URLs are built only from the config's `api_base`; a request contributes nothing
but a path below `/v1`, which is checked so it cannot climb out of that base.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType

from kvmigrate.config import BackendConfig, Config
from kvmigrate.proxy.client import ConnectFailed, HttpClient, Response, SentCall
from kvmigrate.proxy.errors import bad_request, shown
from kvmigrate.proxy.headers import candidate_allowlist
from kvmigrate.proxy.kinds import kind_of
from kvmigrate.proxy.replicas import ReplicaSet


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
        self._client: HttpClient | None = None

    @property
    def client(self) -> HttpClient:
        if self._client is None:
            self._client = HttpClient(
                max_connections=self.config.max_connections,
                connect_timeout=self.config.connect_timeout,
                read_timeout=self.config.read_timeout,
            )
        return self._client

    async def send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> Response:
        """Send a call to the replica `url` is on; until the answer is closed it counts as
        that replica's load, and a failed connection takes the replica out of rotation."""
        lease = self.replicas.lease(url)
        try:
            response = await self.client.request(method, url, headers, body)
        except BaseException as exc:
            if lease is not None:
                lease.release()
                if isinstance(exc, ConnectFailed):
                    self.replicas.mark_down(lease.index)
            raise
        if lease is not None:
            response.on_finished(lease.release)
        return response

    def send_now(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> SentCall | None:
        """Send a call at once where nothing needs waiting for (`HttpClient.send_now`), on a
        backend of one replica: with several, the conversation picks the replica."""
        if self.replicas.multiple:
            return None
        return self.client.send_now(method, url, headers, body)

    async def answer(self, sent: SentCall) -> Response:
        return await self.client.answer(sent)

    def abandon(self, sent: SentCall) -> None:
        self.client.abandon(sent)

    def url(self, suffix: str, conversation: str = "", deployment: str | None = None) -> str:
        """The URL of the checked path below /v1 on the conversation's replica, as the
        backend's kind builds it (Azure names the deployment in the path)."""
        return self.kind.url(self.replicas.pick(conversation), safe_suffix(suffix), deployment)

    def probe(self) -> tuple[str, dict[str, str]]:
        """URL and headers of a cheap readiness probe."""
        return self.kind.probe_url(self.replicas.pick()), dict(self.auth or {})

    async def close(self) -> None:
        await self.replicas.close()
        if self._client is not None:
            await self._client.close()
            self._client = None


def safe_suffix(suffix: str) -> str:
    """Refuse path tricks that could reach another path or host than the configured base.
    `suffix` is already percent-decoded (aiohttp decodes once): an encoding left in it was
    encoded twice, and the raw path's single encodings are `proxy.paths`' to refuse."""
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
        raise bad_request(f"Unsupported path: /v1/{shown(suffix)}")
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
