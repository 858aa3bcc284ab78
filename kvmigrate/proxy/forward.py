"""Calling a backend and relaying its answer to the client, byte for byte, as it arrives."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from kvmigrate.policies.outcome import ErrorKind
from kvmigrate.proxy.client import TIMEOUTS, Response, SentCall, UpstreamError
from kvmigrate.proxy.client_answer import ClientAnswer
from kvmigrate.proxy.envelopes import envelope_for
from kvmigrate.proxy.errors import ProxyError, upstream_timeout, upstream_unreachable
from kvmigrate.proxy.exchange import Exchange
from kvmigrate.proxy.headers import relayed_response_headers
from kvmigrate.proxy.stream_check import SseCheck
from kvmigrate.proxy.upstream import Upstream

BUFFER_LIMIT = 8 * 1024 * 1024
_TIMEOUTS = (*TIMEOUTS, asyncio.TimeoutError)
# What a failing upstream call raises.
TRANSPORT_ERRORS = (UpstreamError, OSError)
# How an OpenAI event stream ends (SSE lines end with LF or CRLF).
_STREAM_DONE = (b"data: [DONE]\n\n", b"data: [DONE]\r\n\r\n")
# How long the stream's last event waits for the upstream's end (its terminating chunk
# follows at once from any working server).
END_GRACE_S = 0.25


class UpstreamFailure(Exception):
    """A backend failed before any byte reached the client, so another may still answer."""

    def __init__(self, kind: str, error: ProxyError) -> None:
        super().__init__(error.message)
        self.kind = kind
        self.error = error


def candidate_failure(backend: str, kind: str) -> UpstreamFailure:
    """A backend's answer refused before its first byte (an error status; from a candidate,
    also a malformed or unserved answer), so the route's fallback may answer instead."""
    return UpstreamFailure(
        kind,
        ProxyError(502, f"Backend `{backend}` failed ({kind}).", "server_error", "upstream_error"),
    )


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    url: str
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class EarlyCall:
    """A call sent before its request was routed (`ProxyService._send_early`), at `sent_at`."""

    backend: str
    call: Call
    sent: SentCall
    sent_at: float


@contextlib.contextmanager
def upstream_errors(upstream: Upstream, response: Response | None = None) -> Iterator[None]:
    """Map the client's transport errors to an `UpstreamFailure`, in this one place (as httpx's
    `map_httpcore_exceptions` does), closing the half-read `response` if one is given."""
    try:
        yield
    except TRANSPORT_ERRORS as exc:
        if response is not None:
            response.close()
        kind = failure_kind(exc)
        if kind == ErrorKind.TIMEOUT:
            raise UpstreamFailure(kind, upstream_timeout(upstream.name)) from None
        raise UpstreamFailure(kind, upstream_unreachable(upstream.name)) from None


def failure_kind(exc: BaseException) -> str:
    """What kept a backend from answering at all, as records and metrics name it."""
    return ErrorKind.TIMEOUT if isinstance(exc, _TIMEOUTS) else ErrorKind.UNREACHABLE


def break_kind(exc: BaseException) -> str:
    """What broke a stream after its first bytes, as records and metrics name it."""
    return ErrorKind.STREAM_TIMEOUT if isinstance(exc, _TIMEOUTS) else ErrorKind.STREAM_BROKEN


async def open_response(upstream: Upstream, call: Call) -> Response:
    """Send the call and wait for the response headers."""
    with upstream_errors(upstream):
        return await upstream.send(call.method, call.url, call.headers, call.body)


async def answer_of(upstream: Upstream, sent: SentCall) -> Response:
    """Wait for the response headers of a call sent already (`Upstream.send_now`)."""
    with upstream_errors(upstream):
        return await upstream.answer(sent)


def is_event_stream(response: Response) -> bool:
    return "text/event-stream" in response.headers.get("content-type", "")


def should_stream(response: Response) -> bool:
    if is_event_stream(response):
        return True
    length = response.content_length
    return length is None or length > BUFFER_LIMIT


async def read_first_chunk(upstream: Upstream, response: Response, exchange: Exchange) -> bytes:
    """Wait for the first body bytes before answering the client: until then a failure can
    still fall back to another backend without the client noticing."""
    with upstream_errors(upstream, response):
        chunk = await response.readany()
    exchange.first_byte = time.perf_counter()
    if chunk:
        exchange.chunks.append(chunk)
    return chunk


# A refused answer's body: why the candidate refused (its context window, a parameter).
REFUSAL_BODY_LIMIT = 64 * 1024
REFUSAL_WAIT_S = 0.25


async def keep_refusal(response: Response, exchange: Exchange) -> None:
    """Keep a refused answer's reason for the record before the primary is asked: up to
    64 KiB, waiting at most a quarter second for it (an error body comes with its head
    from any working server), and never failing the fallback that follows."""
    kept = 0
    try:
        async with asyncio.timeout(REFUSAL_WAIT_S):
            while kept < REFUSAL_BODY_LIMIT and (chunk := await response.readany()):
                exchange.chunks.append(chunk)
                kept += len(chunk)
    except (TimeoutError, UpstreamError):
        pass
    finally:
        response.close()


async def read_whole(upstream: Upstream, response: Response, exchange: Exchange) -> bytes:
    try:
        with upstream_errors(upstream):
            body = await response.read()
    finally:
        response.close()
    exchange.first_byte = exchange.finished = time.perf_counter()
    exchange.chunks.append(body)
    return body


async def send_buffered(
    request: web.Request,
    response: Response,
    body: bytes,
    extra_headers: list[tuple[str, str]],
) -> web.StreamResponse:
    client = ClientAnswer(
        request, response.status, relayed_response_headers(response.headers, extra_headers)
    )
    await client.send_whole(body)
    return client


async def relay_stream(
    request: web.Request,
    response: Response,
    first_chunk: bytes,
    exchange: Exchange,
    extra_headers: list[tuple[str, str]],
    check: SseCheck | None = None,
    rewrite: Callable[[bytes], bytes] | None = None,
    before_eof: Callable[[], Awaitable[None]] | None = None,
) -> web.StreamResponse:
    """Relay the rest of a stream chunk by chunk; `before_eof` runs once the answer is
    whole, before the client's last byte. A break after bytes went out, or a
    candidate's malformed event, ends an event stream with an SSE error event and any other
    body with a reset connection: never a silent truncation."""
    client = ClientAnswer(
        request, response.status, relayed_response_headers(response.headers, extra_headers)
    )
    is_sse = is_event_stream(response)
    error_event = envelope_for(exchange.route).stream_event
    first = rewrite(first_chunk) if rewrite and first_chunk else first_chunk
    # The stream's last event waits for the upstream's end and goes out with the body's:
    # the SDK stops reading at `data: [DONE]`, and its next turn must find this one's
    # links in the store, its answer counted and its copies sent.
    held = await _begin(client, response, first)
    clock = _DecodeClock(exchange)
    try:
        async for chunk in response.iter_any():
            clock.tick()
            exchange.chunks.append(chunk)
            if check is not None and not check.feed(chunk):
                await _end_malformed(client, exchange, _taken(held))
                break
            data = rewrite(chunk) if rewrite else chunk
            if held is not None:
                data, held = held.take() + data, None
            if data.endswith(_STREAM_DONE):
                held = _HeldEnd(client, data)
            else:
                await client.write(data)
        else:
            if check is not None and not check.end():  # a last line no line end closed
                await _end_malformed(client, exchange, _taken(held))
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        exchange.error = ErrorKind.CLIENT_DISCONNECTED
    except asyncio.CancelledError:
        # The proxy is stopping and the drain is over: the client is told, not cut silently.
        exchange.error = ErrorKind.PROXY_SHUTDOWN
        if is_sse:
            message = error_event("The proxy shut down before the answer ended.", exchange.error)
            await _write_quietly(client, _taken(held) + message)
        raise
    except TRANSPORT_ERRORS as exc:
        exchange.error = break_kind(exc)
        if is_sse:
            message = error_event(
                f"The backend stream broke off ({exchange.error}).", exchange.error
            )
            await _write_quietly(client, _taken(held) + message)
        else:
            _abort(request)
    finally:
        last = _taken(held)  # what is still held, its timer stopped
        response.close()
        exchange.finished = time.perf_counter()
        clock.stop()
    if exchange.error == ErrorKind.CLIENT_DISCONNECTED or (exchange.error and not is_sse):
        return client
    if before_eof is not None:
        await before_eof()
    await _finish(client, exchange, last)
    return client


async def _end_malformed(client: ClientAnswer, exchange: Exchange, held: bytes) -> None:
    """End a candidate's stream at its first malformed line with an SSE error event."""
    exchange.error = ErrorKind.MALFORMED_STREAM
    error_event = envelope_for(exchange.route).stream_event
    message = error_event("The backend sent a malformed stream event.", exchange.error)
    await _write_quietly(client, held + message)


async def _begin(client: ClientAnswer, response: Response, first: bytes) -> _HeldEnd | None:
    """The head and the first chunk, or the head alone with the first chunk held when it
    is the stream's last event."""
    held = _HeldEnd(client, first) if first.endswith(_STREAM_DONE) else None
    try:
        await client.begin(first if held is None else b"")
    except BaseException:  # the client left before its headers: the upstream's answer ends
        _taken(held)
        response.close()
        raise
    return held


async def _finish(client: ClientAnswer, exchange: Exchange, last: bytes) -> None:
    try:
        await client.finish(last)
    except ConnectionResetError:
        if last:  # the client left before the stream's last event, as at any other write
            exchange.error = ErrorKind.CLIENT_DISCONNECTED


class _HeldEnd:
    """A stream's last event, held for the upstream's end. An end more than END_GRACE_S
    late lets it go on its own: an upstream that never closes its body must not keep the
    client from an answer it has whole."""

    __slots__ = ("_client", "_data", "_timer")

    def __init__(self, client: ClientAnswer, data: bytes) -> None:
        self._client = client
        self._data = data
        self._timer = asyncio.get_running_loop().call_later(END_GRACE_S, self._release)

    def take(self) -> bytes:
        """What is still held (b"" once released), no longer held."""
        self._timer.cancel()
        data, self._data = self._data, b""
        return data

    def _release(self) -> None:
        data, self._data = self._data, b""
        self._client.write_nowait(data)


def _taken(held: _HeldEnd | None) -> bytes:
    return held.take() if held is not None else b""


def _abort(request: web.Request) -> None:
    """A body that is not an event stream has no in-band way to say it broke: a clean final
    chunk would hand the client half a JSON document as a 200. Resetting the connection
    makes every HTTP client raise, as a short Content-Length body does."""
    if request.transport is not None:
        request.transport.abort()


async def _write_quietly(client: ClientAnswer, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError):
        await client.write(data)


async def drain(response: Response, exchange: Exchange) -> None:
    """Consume a whole response with nobody to relay it to (shadow copies): measures TTFT and
    total time and keeps the bytes for comparison."""
    clock: _DecodeClock | None = None
    try:
        while chunk := await response.readany():
            if clock is not None:
                clock.tick()
            elif exchange.first_byte is None:
                exchange.first_byte = time.perf_counter()
                clock = _DecodeClock(exchange)
            exchange.chunks.append(chunk)
    except TRANSPORT_ERRORS as exc:
        exchange.error = break_kind(exc)
    finally:
        response.close()
        exchange.finished = time.perf_counter()
        if clock is not None:
            clock.stop()


class _DecodeClock:
    """When each chunk after the first arrived, reduced as they come to what decode speed
    needs (the last arrival, the count, the longest gap): a clock read and a comparison per
    chunk, written to the exchange once the stream ends."""

    __slots__ = ("_exchange", "_gap", "_last", "_later")

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange
        self._last = exchange.first_byte
        self._later = 0
        self._gap = 0.0

    def tick(self) -> None:
        now = time.perf_counter()
        if self._last is not None and now - self._last > self._gap:
            self._gap = now - self._last
        self._last = now
        self._later += 1

    def stop(self) -> None:
        x = self._exchange
        x.last_chunk, x.later_chunks, x.max_chunk_gap = self._last, self._later, self._gap
