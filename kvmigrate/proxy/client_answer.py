"""The answer on the client's connection, written as bytes: one head, then the body whole or
chunk by chunk.

aiohttp's `StreamResponse` copies every header into a `CIMultiDict`, works out the framing,
fires its signals and serialises the head again, a large share of what the proxy adds
to a turn at concurrency 1 (benchmarks/critical_path.py measures it). What the proxy relays
is already parsed (llhttp read the upstream's head), so it goes out as it came, the head in
the same send as the body or the first chunk. aiohttp still reads the request and owns the
connection: `ClientAnswer` is the `StreamResponse` it gets back, already written, and says
whether the connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Iterable
from email.utils import formatdate
from http import HTTPStatus

from aiohttp import web
from aiohttp.web_request import BaseRequest

from kvmigrate.proxy.client.head import encode_head
from kvmigrate.vendor_internals.aiohttp_internals import set_keep_alive

_HTTP11 = (1, 1)
_LAST_CHUNK = b"0\r\n\r\n"


@functools.lru_cache(maxsize=64)
def _status_line(version: tuple[int, int], status: int) -> str:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    return f"HTTP/{version[0]}.{version[1]} {status} {reason}\r\n"


@functools.lru_cache(maxsize=2)
def _http_date(second: int) -> str:
    return formatdate(second, usegmt=True)


def _has_no_body(status: int) -> bool:
    """RFC 9110 sections 6.4.1 and 8.6: 1xx, 204 and 304 answers never have a body, nor a
    length or chunked coding."""
    return status in (204, 304) or 100 <= status < 200


class ClientAnswer(web.StreamResponse):
    """One answer to one request, written straight to its connection.

    `headers` must not carry framing or connection headers (`Content-Length`,
    `Transfer-Encoding`, `Connection`, `Date`): they are set here.
    """

    def __init__(
        self, request: BaseRequest, status: int, headers: Iterable[tuple[str, str]]
    ) -> None:
        super().__init__(status=status)
        self._client = request
        self._headers_out = headers
        self._no_body = _has_no_body(status)
        # A HEAD answer has a head only (RFC 9110 section 9.3.2), its length included.
        self._empty = self._no_body or request.method == "HEAD"
        # Our own flag: `_chunked` is StreamResponse's private one (tests/private_api guard).
        self._chunking = False

    async def send_whole(self, body: bytes) -> None:
        """The whole answer at once: head and body in one send."""
        length = [] if self._no_body else [f"Content-Length: {len(body)}\r\n"]
        head = self._head(length, reusable=True)
        await self._send(head if self._empty else head + body)

    async def begin(self, first: bytes) -> None:
        """The head of an answer whose length is not known yet, with its first bytes."""
        # HTTP/1.0 has no chunked coding: the body ends where the connection does.
        self._chunking = not self._empty and self._client.version >= _HTTP11
        framing = ["Transfer-Encoding: chunked\r\n"] if self._chunking else []
        head = self._head(framing, reusable=self._chunking or self._empty)
        await self._send(head + self._framed(first))

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            await self._send(self._framed(bytes(data)))

    def write_nowait(self, data: bytes) -> None:
        """`data` at once, from a callback: dropped if the client has gone (the answer's
        next write says so), and past any backpressure (a few bytes)."""
        with contextlib.suppress(ConnectionResetError):
            self._put(self._framed(data))

    async def finish(self, last: bytes = b"") -> None:
        """The body's `last` bytes, and the end of a chunked body, in one send; the end only
        once (none for a whole or connection-delimited body, nor for an empty one, which
        `begin` never chunks)."""
        if self._chunking:
            framed = self._framed(last)
            self._chunking = False
            await self._send(framed + _LAST_CHUNK)
        elif last:
            await self._send(self._framed(last))

    # What aiohttp calls once the handler has returned: the answer is written already.
    async def prepare(self, request: BaseRequest) -> None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None

    def _head(self, framing: list[str], reusable: bool) -> bytes:
        """The status line, the relayed headers, `framing`, Date and Connection: deciding
        whether the connection stays open after this answer (aiohttp reads `keep_alive`
        once the handler returns)."""
        version = self._client.version
        keep_alive = reusable and self._client.keep_alive
        set_keep_alive(self, keep_alive)
        tail = [*framing, f"Date: {_http_date(int(time.time()))}\r\n"]
        if version >= _HTTP11 and not keep_alive:
            tail.append("Connection: close\r\n")
        elif version < _HTTP11 and keep_alive:
            tail.append("Connection: keep-alive\r\n")
        start = _status_line((version.major, version.minor), self.status)
        return encode_head([start], self._headers_out, [*tail, "\r\n"])

    def _framed(self, data: bytes) -> bytes:
        if self._empty or not data:
            return b""
        if self._chunking:
            return b"%x\r\n%b\r\n" % (len(data), data)
        return data

    def _put(self, data: bytes) -> asyncio.Transport:
        """`data` handed to the client's transport, which is returned."""
        transport = self._client.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        if data:
            transport.write(data)
            # aiohttp's own error path reads it: once bytes are out, no error answer follows.
            self._client.writer.output_size += len(data)
        return transport

    async def _send(self, data: bytes) -> None:
        transport = self._put(data)
        if transport.get_write_buffer_size():
            # Only now can the transport have paused the protocol (past its high-water
            # mark): the wait, and its coroutine, are skipped for the usual empty buffer.
            await self._client.writer.drain()
