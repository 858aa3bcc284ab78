"""The proxy's upstream HTTP/1.1 client: keep-alive connections per origin, bounded.

Each backend has one `HttpClient`. It sends a call on an idle connection to the URL's
origin (the most recently used first, so the warm ones stay warm) or opens one, with TLS
for https; at most `max_connections` calls are in flight at once, the rest wait their
turn. A call that finds its reused connection closed by the server before any byte of an
answer is sent once more on a new connection. Idle connections close after `keepalive_s`.
`send_now` sends at once, when a connection is idle and a slot free, so that the caller can
work while the answer comes (`answer` then waits for its head).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from kvmigrate.proxy.client.connection import Connection, Response
from kvmigrate.proxy.client.errors import ConnectFailed, ConnectTimeout, ServerDisconnected
from kvmigrate.proxy.client.head import encode_head

# Request methods that carry no body unless one is given (no Content-Length: 0 for them).
_BODILESS_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
# Set by the client itself from the URL and the body.
_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
# Printable ASCII but the space: what may stay as it is in a request target.
_TARGET_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))


@dataclass
class _Origin:
    key: str
    host: str
    port: int
    host_header: str
    tls: ssl.SSLContext | None
    idle: list[Connection] = field(default_factory=list)


class HttpClient:
    """Keep-alive HTTP/1.1 connections from the proxy to one backend's replicas."""

    def __init__(
        self,
        *,
        max_connections: int,
        connect_timeout: float,
        read_timeout: float,
        keepalive_s: float = 30.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._keepalive_s = keepalive_s
        self._tls = tls
        self._slots = asyncio.Semaphore(max_connections)
        self._origins: dict[str, _Origin] = {}
        self._open: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._shut = False

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> Response:
        """Send a call and wait for its answer's status and headers. The caller must
        `close()` the answer (reading it to the end does)."""
        origin, target = self._origin_of(url)
        head = request_head(method, target, origin.host_header, headers, body)
        return await self._call(origin, method, head, body)

    def send_now(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> SentCall | None:
        """Send a call at once, if a slot is free and a connection idle (None: nothing was
        sent): the caller does other work while the answer comes, then waits for its head
        with `answer`, which also gives the slot back at the answer's end."""
        if self._slots.locked():
            return None
        origin, target = self._origin_of(url)
        head = request_head(method, target, origin.host_header, headers, body)
        connection = self._idle_connection(origin)
        if connection is None:
            return None
        _take_free_slot(self._slots)
        response = self._send(connection, method, head, body)
        response.on_finished(self._slots.release)
        return SentCall(origin, method, head, body, response)

    async def answer(self, sent: SentCall) -> Response:
        """The status and headers of a call `send_now` sent. A reused connection the server
        had closed before answering gets the call again, on a new one, as `request` does."""
        try:
            await sent.response.wait_head()
            return sent.response
        except ServerDisconnected as exc:
            sent.response.close()
            if not exc.before_answer:
                raise
        except BaseException:
            sent.response.close()
            raise
        return await self._call(sent.origin, sent.method, sent.head, sent.body)

    @staticmethod
    def abandon(sent: SentCall) -> None:
        """A call `send_now` sent whose answer nobody will wait for: its connection closed
        (the answer may be on its way), its slot given back."""
        sent.response.close()

    async def _call(self, origin: _Origin, method: str, head: bytes, body: bytes) -> Response:
        """A call in one of the slots: at most `max_connections` at once, the rest wait."""
        await self._slots.acquire()
        try:
            response = await self._exchange(origin, method, head, body)
        except BaseException:
            self._slots.release()
            raise
        response.on_finished(self._slots.release)
        return response

    def _send(self, connection: Connection, method: str, head: bytes, body: bytes) -> Response:
        response = Response(
            connection,
            head_request=method == "HEAD",
            read_timeout=self._read_timeout,
            on_close=self._closed,
        )
        connection.send(head, body)
        return response

    async def _exchange(self, origin: _Origin, method: str, head: bytes, body: bytes) -> Response:
        while True:
            connection = self._idle_connection(origin) or await self._connect(origin)
            response = self._send(connection, method, head, body)
            try:
                await response.wait_head()
            except ServerDisconnected as exc:
                response.close()
                # A server may close an idle keep-alive connection just as it is reused.
                if connection.reused and exc.before_answer:
                    continue
                raise
            except BaseException:
                response.close()
                raise
            return response

    def _idle_connection(self, origin: _Origin) -> Connection | None:
        now = asyncio.get_running_loop().time()
        while origin.idle:
            connection = origin.idle.pop()
            if not connection.closed and now - connection.idle_since < self._keepalive_s:
                connection.reused = True
                return connection
            connection.abort()
        return None

    async def _connect(self, origin: _Origin) -> Connection:
        loop = asyncio.get_running_loop()
        where = f"{origin.host}:{origin.port}"
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: Connection(self._open.discard),
                    origin.host,
                    origin.port,
                    ssl=origin.tls,
                    server_hostname=origin.host if origin.tls is not None else None,
                )
        except TimeoutError:
            timeout = self._connect_timeout
            raise ConnectTimeout(f"no connection to {where} within {timeout:g} s") from None
        except OSError as exc:  # refused, unresolvable, TLS (ssl.SSLError is an OSError)
            raise ConnectFailed(f"cannot connect to {where}: {exc}") from None
        connection.pool_key = origin.key
        self._open.add(connection)
        return connection

    def _closed(self, connection: Connection, reusable: bool) -> None:
        """An answer is done with its connection: keep it for the next call, or drop it."""
        origin = self._origins.get(connection.pool_key)
        if not reusable or connection.closed or self._shut or origin is None:
            connection.abort()
            return
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        origin.idle.append(connection)
        if self._sweep is None:
            self._sweep = loop.call_later(self._keepalive_s, self._close_stale)

    def _close_stale(self) -> None:
        """Close the connections idle longer than `keepalive_s`; look again later if any
        are left."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for origin in self._origins.values():
            fresh = [c for c in origin.idle if now - c.idle_since < self._keepalive_s]
            for connection in origin.idle:
                if connection not in fresh:
                    connection.abort()
            origin.idle[:] = [c for c in fresh if not c.closed]
        if any(origin.idle for origin in self._origins.values()):
            self._sweep = loop.call_later(self._keepalive_s, self._close_stale)

    def _origin_of(self, url: str) -> tuple[_Origin, str]:
        """The origin a URL names and the request target on it. Upstream URLs come from
        the config's `api_base`, so each origin is parsed once."""
        cut = url.find("/", url.find("//") + 2)
        prefix, target = (url, "/") if cut < 0 else (url[:cut], url[cut:])
        origin = self._origins.get(prefix)
        if origin is None:
            origin = self._origins[prefix] = self._new_origin(prefix)
        if not (target.isascii() and target.isprintable()) or " " in target:
            target = quote(target, safe=_TARGET_SAFE)
        return origin, target

    def _new_origin(self, prefix: str) -> _Origin:
        parts = urlsplit(prefix)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {prefix}")
        tls = None
        if parts.scheme == "https":
            tls = self._tls or ssl.create_default_context()
        port = parts.port or (443 if tls is not None else 80)
        return _Origin(prefix, parts.hostname, port, parts.netloc.rpartition("@")[2], tls)

    async def close(self) -> None:
        """Close every connection, idle or not; calls still open fail."""
        self._shut = True
        if self._sweep is not None:
            self._sweep.cancel()
        for connection in list(self._open):
            connection.abort()
        self._open.clear()
        for origin in self._origins.values():
            origin.idle.clear()


@dataclass(frozen=True, slots=True)
class SentCall:
    """A call `HttpClient.send_now` sent, its answer not waited for yet."""

    origin: _Origin
    method: str
    head: bytes
    body: bytes
    response: Response


def _take_free_slot(slots: asyncio.Semaphore) -> None:
    """Take a slot of `slots`, which has one free, without a suspension: `acquire` returns at
    once when the semaphore is not locked (asyncio's documented behaviour)."""
    taking = slots.acquire()
    try:
        taking.send(None)
    except StopIteration:
        return
    taking.close()
    raise RuntimeError("a free slot could not be taken at once")


def request_head(
    method: str, target: str, host: str, headers: Mapping[str, str], body: bytes
) -> bytes:
    """The request line and headers, with Host and Content-Length from the URL and body."""
    kept = ((n, v) for n, v in headers.items() if n.lower() not in _OWN_HEADERS)
    length = body or method not in _BODILESS_METHODS
    tail = [f"Content-Length: {len(body)}\r\n", "\r\n"] if length else ["\r\n"]
    return encode_head([f"{method} {target} HTTP/1.1\r\n", f"Host: {host}\r\n"], kept, tail)
