"""One keep-alive HTTP/1.1 connection to an upstream, and the answer read from it.

The parser is llhttp (through httptools, the parser uvicorn serves with), fed straight from
the protocol's `data_received`: no stream reader in between and no timer per read. Body
bytes reach the answer as they arrive; reading pauses while a slow consumer leaves more
than `HIGH_WATER` bytes unread, so one stalled client cannot buffer a whole upstream.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Protocol, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from kvmigrate.proxy.client.errors import (
    ProtocolViolation,
    ReadTimeout,
    ServerDisconnected,
    UpstreamError,
)

# An answer's status line and headers; llhttp itself bounds no size.
MAX_HEAD_BYTES = 64 * 1024
HIGH_WATER = 1 << 20
# Statuses whose answers never have a body (RFC 9110 section 6.4.1), so EOF cannot end one.
_BODILESS = frozenset({204, 304})


class ChunkSink(Protocol):
    """Where a collected answer's body parts go (`Response.collect`)."""

    def append(self, chunk: bytes, /) -> None: ...


class Connection(asyncio.Protocol):
    """A transport, and the answer in progress on it (none while the connection is idle)."""

    __slots__ = ("_on_lost", "answer", "closed", "idle_since", "pool_key", "reused", "transport")

    def __init__(self, on_lost: Callable[[Connection], None]) -> None:
        self.transport: asyncio.Transport | None = None
        # Weak: an answer its reader dropped unclosed must still be collected (see __del__).
        self.answer: weakref.ref[Response] | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self.pool_key = ""  # the origin whose idle list it goes back to
        self._on_lost = on_lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        answer = self.answer() if self.answer is not None else None
        if answer is None:
            self.abort()  # bytes nobody asked for: the connection is out of step
            return
        answer.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._on_lost(self)
        answer = self.answer() if self.answer is not None else None
        if answer is not None:
            answer.lost(exc)

    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        if len(body) < 65536:
            self.transport.write(head + body)  # one segment for a typical request
        else:
            self.transport.writelines((head, body))

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()


class Response:
    """An upstream's answer: the status and headers, then the body as it arrives.

    `close()` ends it: its connection goes back to the pool when the answer came whole and
    the server keeps the connection alive, and is dropped otherwise. Reading to the end
    closes it too. `on_finished` callbacks run once, at the close.
    """

    __slots__ = (
        "__weakref__",
        "_buffered",
        "_chunks",
        "_closed",
        "_collector",
        "_complete",
        "_error",
        "_finished",
        "_head_bytes",
        "_head_done",
        "_head_read",
        "_head_request",
        "_head_seen",
        "_keep_alive",
        "_last_read",
        "_loop",
        "_on_close",
        "_parser",
        "_paused",
        "_raw_headers",
        "_read_timeout",
        "_received",
        "_ref",
        "_sink",
        "_timer",
        "_until_eof",
        "_waiter",
        "connection",
        "content_length",
        "first_body_at",
        "headers",
        "status",
    )

    def __init__(
        self,
        connection: Connection,
        *,
        head_request: bool,
        read_timeout: float,
        on_close: Callable[[Connection, bool], None],
    ) -> None:
        self.status = 0
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS
        self.content_length: int | None = None
        self.connection = connection
        self._loop = asyncio.get_running_loop()
        # The parser holds this answer's bound methods, a reference cycle: `close()` breaks
        # it, so that an answer dies by reference count. Left to the cyclic collector, the
        # proxy's every upstream call was garbage that a young collection had to find (with
        # shadow copies under load, frequent pauses: benchmarks/proxy_overhead.py measures
        # the CPU per request).
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0  # of the headers parsed
        self._head_read = 0  # of the reads while the head is incomplete
        self._head_request = head_request
        self._head_done = False
        # Made by the first `wait_head` that has to wait: a collected answer never does.
        self._head_seen: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._keep_alive = False
        self._until_eof = False
        self._received = False
        self._error: UpstreamError | None = None
        self._closed = False
        self._on_close = on_close
        self._finished: list[Callable[[], None]] = []
        self._collector: Callable[[], None] | None = None
        self._sink: ChunkSink | None = None
        self.first_body_at = 0.0  # perf_counter at the first body bytes, when collected
        self._read_timeout = read_timeout
        self._last_read = self._loop.time()
        self._ref = weakref.ref(self)
        connection.answer = self._ref
        self._timer = self._loop.call_at(self._last_read + read_timeout, _time_check, self._ref)

    # -- what the connection hands over ---------------------------------------------------

    def feed(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # closed: nothing more is read into it
            return
        self._received = True
        self._last_read = self._loop.time()
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(ProtocolViolation(f"the answer's head is over {MAX_HEAD_BYTES} bytes"))
            else:
                self._fail(ProtocolViolation(f"the answer is not valid HTTP/1.1 ({exc})"))
            return
        finally:
            # A collected answer's parts from this read go on as one: an upstream that
            # sends a chunked body a byte per chunk must not cost an object per byte.
            if self._sink is not None and self._chunks:
                self._sink.append(self._take_buffered())
        if not self._head_done:  # a head still coming: every byte so far is head
            self._head_read += len(data)
            if self._head_read > MAX_HEAD_BYTES:
                self._fail(ProtocolViolation(f"the answer's head is over {MAX_HEAD_BYTES} bytes"))

    def lost(self, exc: Exception | None) -> None:
        if self._complete:
            return
        if exc is None and self._head_done and self._until_eof:
            self.on_message_complete()  # a body delimited by the end of the connection
            return
        state = "while answering" if self._received else "before answering"
        self._fail(
            ServerDisconnected(
                f"the upstream closed the connection {state}", before_answer=not self._received
            )
        )

    # -- llhttp's callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:  # a second answer to one request: never reuse this connection
            self._keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_done:
            return  # a chunked body's trailers are dropped
        self._raw_headers.append((name, value))
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge  # stops the parser; `feed` says why

    def on_headers_complete(self) -> None:
        parser = self._parser
        if self._head_done or parser is None:
            return
        status = parser.get_status_code()
        if status < 200:  # an interim answer (103 Early Hints): the final one follows
            self._raw_headers = []
            return
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in self._raw_headers:
            headers.add(name.decode("latin-1"), _text(value))
        self._raw_headers = []
        self.status = status
        self.headers = CIMultiDictProxy(headers)
        length = headers.get("content-length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._keep_alive = parser.should_keep_alive()
        self._until_eof = length is None and not chunked and status not in _BODILESS
        self._head_done = True
        self._head_arrived()
        if self._head_request:  # its Content-Length describes a body that never comes
            self._keep_alive = False
            self.on_message_complete()

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return
        self._chunks.append(body)
        if self._sink is not None:  # collected: the read's parts go to it as one (`feed`)
            if not self.first_body_at:
                self.first_body_at = time.perf_counter()
            return
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused:
            self._paused = True
            self.connection.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self._head_done or self._complete:
            return  # the end of an interim answer, or of one nobody asked for
        self._complete = True
        self._timer.cancel()
        self._ended()

    # -- the consumer's side ----------------------------------------------------------------

    async def wait_head(self) -> None:
        """Until the status and headers have arrived; raises if the call failed first."""
        if not self._head_done and self._error is None:
            if self._head_seen is None:
                self._head_seen = self._loop.create_future()
            await self._head_seen
        if not self._head_done:
            assert self._error is not None
            raise self._error

    async def readany(self) -> bytes:
        """The body bytes buffered so far (waiting for some), or b"" at the end."""
        while not self._chunks:
            if self._complete:
                self.close()
                return b""
            if self._error is not None:
                raise self._error
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self._take_buffered()

    async def iter_any(self) -> AsyncIterator[bytes]:
        while chunk := await self.readany():
            yield chunk

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def collect(self, done: Callable[[], None], into: ChunkSink) -> None:
        """Hand every body part to `into` as it arrives, and call `done` once the answer is
        complete or has failed, instead of a reader waiting for it: then `error` says how it
        ended. Not called if the answer is closed first. Reading never pauses (nobody reads
        before the end), so `into` is what bounds the memory an answer holds: a shadow
        copy's is the exchange's `ChunkLog`, which keeps its head and its tail."""
        self._collector = done
        self._sink = into
        if self._chunks:
            if not self.first_body_at:
                self.first_body_at = time.perf_counter()
            into.append(self._take_buffered())
        if self._complete or self._error is not None:
            self._ended()

    @property
    def error(self) -> UpstreamError | None:
        return self._error

    def on_finished(self, callback: Callable[[], None]) -> None:
        if self._closed:
            callback()
        else:
            self._finished.append(callback)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._parser = None
        self._collector = None
        self._sink = None
        self._timer.cancel()
        reusable = self._complete and self._keep_alive and self._error is None
        if reusable and self._paused:
            self.connection.resume_reading()
        self.connection.answer = None
        self._on_close(self.connection, reusable)
        for callback in self._finished:
            callback()
        self._finished.clear()

    def __del__(self) -> None:
        # A safety net: an answer nobody closed would hold its connection slot (and its
        # replica's lease) for good, and enough of them would stall every call. The
        # collector may run in any thread, so the close goes to the loop's.
        if getattr(self, "_closed", True) or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(
            _close_dropped, self._timer, self.connection, self._on_close, tuple(self._finished)
        )

    # -- inside ---------------------------------------------------------------------------

    def _take_buffered(self) -> bytes:
        """The body bytes buffered so far, as one, and reading resumed if it had paused."""
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            self.connection.resume_reading()
        return data

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _head_arrived(self) -> None:
        """The head, or the failure that ends the wait for it."""
        seen = self._head_seen
        if seen is not None and not seen.done():
            seen.set_result(None)

    def _ended(self) -> None:
        """Complete or failed: wake the reader, or have the collector called. Soon, not
        now: this may run inside the parser's callbacks, and the collector closes."""
        if self._collector is not None:
            self._loop.call_soon(self._deliver)
        else:
            self._wake()

    def _deliver(self) -> None:
        collector, self._collector = self._collector, None
        if collector is not None and not self._closed:
            collector()

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None and not self._complete:
            self._error = error
        self._keep_alive = False
        self._timer.cancel()
        self.connection.abort()
        self._head_arrived()
        self._ended()

    def _check_read_timeout(self) -> None:
        if self._complete or self._closed or self._error is not None:
            return
        now = self._loop.time()
        if self._chunks and self._collector is None:
            # The reader has bytes to read: nobody waits on the upstream. (A collected
            # answer's bytes wait for its end, so only the upstream's silence counts.)
            due = now + self._read_timeout
        else:
            due = self._last_read + self._read_timeout
            if now >= due:
                self._fail(ReadTimeout(f"the upstream sent nothing for {self._read_timeout:g} s"))
                return
        self._timer = self._loop.call_at(due, _time_check, self._ref)


def _close_dropped(
    timer: asyncio.TimerHandle,
    connection: Connection,
    on_close: Callable[[Connection, bool], None],
    finished: tuple[Callable[[], None], ...],
) -> None:
    timer.cancel()
    connection.answer = None
    on_close(connection, False)
    for callback in finished:
        callback()


def _time_check(ref: weakref.ref[Response]) -> None:
    """The read timer holds its answer weakly, like the connection does."""
    answer = ref()
    if answer is not None:
        answer._check_read_timeout()


class _HeadTooLarge(Exception):
    pass


def _text(value: bytes) -> str:
    """A header value as text: UTF-8 when it is, else each byte as one character."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
