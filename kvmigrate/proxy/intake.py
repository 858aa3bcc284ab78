"""Taking a client's request in: its key checked against the proxy's own, its body read
within the size and time limits (and inflated, when it came compressed, only then: see
`kvmigrate.proxy.inflate`). Every route that answers a client starts here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import StreamReader, hdrs, web
from aiohttp.http import HttpVersion11

from kvmigrate.config import ServerConfig
from kvmigrate.config.secret import Secret
from kvmigrate.proxy.envelopes import envelope_for_path
from kvmigrate.proxy.errors import ProxyError, body_too_large, unauthorized
from kvmigrate.proxy.headers import bearer_token
from kvmigrate.proxy.inflate import body_coding, inflate, undecodable

ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def authorize(request: web.Request, master_key: Secret | None) -> None:
    """Without a master key the proxy is open (the primary checks the client's own key)."""
    if master_key is None:
        return
    token = bearer_token(request.headers)
    if token is None:
        raise unauthorized(
            "Missing API key: send it as `Authorization: Bearer <key>` or `x-api-key`."
        )
    if not master_key.matches(token):
        raise unauthorized("Incorrect API key provided.")


async def read_body(request: web.Request, server: ServerConfig) -> bytes:
    """The body, inflated when it came compressed. Every caller has authenticated the
    request first: no one without a key makes the proxy inflate anything."""
    coding = body_coding(request.headers)  # a coding it cannot inflate: 415, nothing read
    raw = await _read_raw(request, server)
    return raw if coding is None else await inflate(raw, coding, server.max_body_bytes)


async def _read_raw(request: web.Request, server: ServerConfig) -> bytes:
    limit = server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise body_too_large(limit)
    try:
        if request.content.is_eof():  # the whole body came with the headers: no wait
            return await _read(request.content, limit)
        # A client that trickles its body (slow-loris) must not hold a slot forever. A
        # deadline on this task: wait_for made a second task per request.
        async with asyncio.timeout(server.body_timeout_seconds):
            return await _read(request.content, limit)
    except web.RequestPayloadError:
        # A body aiohttp could not read: a broken chunked framing. The client's mistake,
        # so a 400 and no traceback.
        _end_broken_body(request)
        raise undecodable() from None
    except TimeoutError:
        raise ProxyError(
            408,
            "The request body did not arrive in time.",
            "invalid_request_error",
            "request_timeout",
        ) from None


async def _read(payload: StreamReader, limit: int) -> bytes:
    """The body as the payload's chunks joined: a body that came in one chunk is that
    chunk. `request.read()` copied every body twice (into a bytearray, then out of it),
    which an agent's large turns pay every time (benchmarks/agent_body.py). A body without
    a Content-Length is cut off at `limit`."""
    raise_limits = getattr(payload, "set_read_chunk_size", None)  # aiohttp 3.14
    if raise_limits is not None:
        raise_limits(limit)  # read on without pausing the transport every 64 KB
    chunks: list[bytes] = []
    size = 0
    while chunk := await payload.readany():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _end_broken_body(request: web.Request) -> None:
    """After answering, aiohttp reads what is left of an unread body (lingering) and would
    meet the decode error again, logging it as an unhandled exception: the body is marked
    finished instead. Its parser stopped mid-body, so where the next request starts on
    this connection is unknown: it closes once the answer is sent."""
    request.content.feed_eof()
    request.protocol.close()


def expect_handler(server: ServerConfig, refused: Callable[[int], None]) -> ExpectHandler:
    """The answer to `Expect: 100-continue`: `100 Continue`, as aiohttp's own handler sends,
    except to a body whose Content-Length is over the limit, which gets its 413 at once (in
    the route's envelope; `refused` counts it), and to one in a coding the proxy cannot
    inflate (its 415). Before, the client was told to go on, sent the whole body (curl
    waits for the 100 before any large upload), and got the 413 after."""

    async def expect(request: web.Request) -> web.StreamResponse | None:
        limit = server.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return _refused_before_the_body(request, body_too_large(limit), refused)
        try:
            body_coding(request.headers)
        except ProxyError as unsupported:
            return _refused_before_the_body(request, unsupported, refused)
        if request.version != HttpVersion11:
            return None
        if request.headers.get(hdrs.EXPECT, "").strip().lower() != "100-continue":
            error = ProxyError(417, "Only `Expect: 100-continue` is supported.")
            return _refused_before_the_body(request, error, refused)
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer itself has not started
        return None

    return expect


def _refused_before_the_body(
    request: web.Request, error: ProxyError, refused: Callable[[int], None]
) -> web.Response:
    """The error in the route's envelope (`refused` counts it), on a connection that then
    closes: the body may or may not follow, so its next bytes are not known to be a request."""
    refused(error.status)
    response = error.response(body=envelope_for_path(request.path).body(error))
    response.force_close()
    return response
