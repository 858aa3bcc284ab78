"""Compressed request bodies: inflated only after the key is checked, never past
`server.max_body_bytes` of output and never at length on the event loop; a coding the
proxy cannot inflate is a 415. The probe's bomb: 1 MB of gzip that inflates to 1 GiB."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import socket
import time
import urllib.request
import zlib
from collections.abc import Callable

import orjson
import pytest
from proxy_support import (
    CHAT_BODY,
    HOSTED_MODEL,
    ProxyFactory,
    Recorded,
    RunningProxy,
    send_raw,
    status_of,
)

from kvmigrate.serving import BackgroundServer

Upstream = tuple[BackgroundServer, list[Recorded]]
KEY = "sk-master"
WITH_KEY = "server: {master_key: " + KEY + "}"
AUTH = b"Authorization: Bearer " + KEY.encode()
BOMB_BYTES = 1 << 30  # what the bomb inflates to


@functools.cache
def bomb() -> bytes:
    """A gzip body of about 1 MB that inflates to `BOMB_BYTES`: a JSON object's start, then
    zeros (the proxy never gets as far as parsing it)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    parts = [packer.compress(b'{"model": "gpt-4o-mini", "pad": "')]
    parts += [packer.compress(zeros) for _ in range(BOMB_BYTES >> 20)]
    return b"".join([*parts, packer.flush()])


@functools.cache
def inflating_cost() -> float:
    """CPU seconds this machine takes to inflate the bomb whole: what a worker's event loop
    spent on it before (at the arrival of its bytes, with or without a key)."""
    started = time.thread_time()
    stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pending = bomb()
    while pending:
        stream.decompress(pending, 64 << 20)
        pending = stream.unconsumed_tail
    return time.thread_time() - started


def loop_cpu(proxy: RunningProxy) -> float:
    """CPU seconds the proxy's event-loop thread has used so far (not its worker threads)."""

    async def now() -> float:
        return time.thread_time()

    return asyncio.run_coroutine_threadsafe(now(), proxy.server.loop).result(10)


def health(proxy: RunningProxy) -> int:
    with urllib.request.urlopen(proxy.url + "/health", timeout=30) as response:
        return int(response.status)


def send_in_halves(proxy: RunningProxy, head: list[bytes], body: bytes) -> tuple[bytes, int]:
    """(the answer, /health's status asked between the body's halves): the bomb is on its
    way while the same worker answers someone else."""
    host, port = proxy.url.removeprefix("http://").split(":")
    lines = [*head, b"Host: proxy", b"Connection: close", b"Content-Length: %d" % len(body)]
    half = len(body) // 2
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body[:half])
        probed = health(proxy)
        # Answered and closed before the rest: the answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(body[half:])
        data = b""
        while chunk := sock.recv(65536):  # to the close: the proxy has read all it will
            data += chunk
    return data, probed


def error_of(response: bytes) -> dict[str, object]:
    error = orjson.loads(response.partition(b"\r\n\r\n")[2])["error"]
    assert isinstance(error, dict)
    return error


@pytest.mark.slow
def test_a_bomb_without_a_key_is_refused_and_never_inflated(
    make_proxy: ProxyFactory, recording_upstream: Upstream
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url, extra=WITH_KEY)
    before = loop_cpu(proxy)
    head = [b"POST /v1/chat/completions HTTP/1.1", b"Content-Encoding: gzip"]
    answer, probed = send_in_halves(proxy, head, bomb())
    spent = loop_cpu(proxy) - before
    assert status_of(answer) == 401, answer[:300]
    assert "Missing API key" in str(error_of(answer)["message"])
    assert probed == 200
    assert seen == []
    # Before the fix the loop inflated the whole GiB (aiohttp's parser, as the bytes came,
    # and again reading the rest after the 401): all of `inflating_cost`, not a quarter.
    assert spent < inflating_cost() / 4, (spent, inflating_cost())


@pytest.mark.parametrize(
    ("path", "anthropic"),
    [("/v1/chat/completions", False), ("/v1/messages", True), ("/v1/files", False)],
)
def test_a_bomb_with_the_key_is_a_413_in_the_route_s_envelope_inflated_off_the_loop(
    make_proxy: ProxyFactory, recording_upstream: Upstream, path: str, anthropic: bool
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url, extra=WITH_KEY)
    before = loop_cpu(proxy)
    head = [b"POST " + path.encode() + b" HTTP/1.1", b"Content-Encoding: gzip", AUTH]
    answer, probed = send_in_halves(proxy, head, bomb())
    spent = loop_cpu(proxy) - before
    assert status_of(answer) == 413, answer[:300]
    error = error_of(answer)
    assert "exceeds the limit of 33554432 bytes" in str(error["message"])
    if anthropic:
        assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["type"] == "error"
    else:
        assert error["code"] == "request_too_large"
    assert probed == 200
    assert seen == []
    assert spent < inflating_cost() / 4, (spent, inflating_cost())


def _deflate_raw(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("coding", "pack"),
    [
        (b"gzip", gzip.compress),
        (b"x-gzip", gzip.compress),
        (b"GZIP", gzip.compress),
        (b"deflate", zlib.compress),  # a zlib stream, as RFC 9110 means it
        (b"deflate", _deflate_raw),  # the raw data some clients send as `deflate`
        (b"identity", bytes),
        (b"gzip, identity", gzip.compress),
    ],
    ids=["gzip", "x-gzip", "upper-case", "deflate-zlib", "deflate-raw", "identity", "gzip+id"],
)
@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/files"])
def test_a_compressed_body_is_forwarded_inflated(
    make_proxy: ProxyFactory,
    recording_upstream: Upstream,
    coding: bytes,
    pack: Callable[[bytes], bytes],
    path: bytes,
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    head = [b"Content-Encoding: " + coding]
    answer = send_raw(proxy.url, b"POST " + path + b" HTTP/1.1", head, pack(CHAT_BODY))
    assert status_of(answer) == 200, answer[:300]
    # The primary's call (a chat request's shadow copy to the candidate names its model).
    # (and the noise calls the primary may get, the same body again). The keyless request
    # also has the proxy ask the open primary's model list (a GET), which carries no body.
    posted = [orjson.loads(r.body) for r in seen if r.method == "POST"]
    served = [body for body in posted if body["model"] == HOSTED_MODEL]
    assert served
    assert all(body == orjson.loads(CHAT_BODY) for body in served)
    for call in seen:
        assert "content-encoding" not in {name.lower() for name in call.headers}


def test_the_limit_is_on_the_inflated_body(
    make_proxy: ProxyFactory, recording_upstream: Upstream
) -> None:
    upstream, seen = recording_upstream
    limit = 4096
    proxy = make_proxy(
        hosted_url=upstream.url,
        vllm_url=upstream.url,
        extra=f"server: {{max_body_bytes: {limit}}}",
    )
    opening = b'{"model": "gpt-4o-mini", "messages": [], "pad": "'
    fits = opening + b"a" * (limit - len(opening) - 2) + b'"}'
    assert len(fits) == limit
    line, head = b"POST /v1/chat/completions HTTP/1.1", [b"Content-Encoding: gzip"]
    assert status_of(send_raw(proxy.url, line, head, gzip.compress(fits))) == 200
    assert fits in [r.body for r in seen]
    over = fits[:-2] + b'a"}'
    answer = send_raw(proxy.url, line, head, gzip.compress(over))
    assert status_of(answer) == 413, answer[:300]
    assert error_of(answer)["code"] == "request_too_large"
    longer_pad = b"a" * (limit - len(opening) - 1) + b'"'
    assert not [r for r in seen if longer_pad in r.body]


@pytest.mark.parametrize(
    "coding",
    [b"br", b"zstd", b"compress", b"gzip, gzip", b"deflate, gzip", b"gzip, br", b"bogus"],
)
@pytest.mark.parametrize(
    ("path", "anthropic"),
    [(b"/v1/chat/completions", False), (b"/v1/messages", True), (b"/v1/files", False)],
)
def test_a_coding_the_proxy_cannot_inflate_is_a_415(
    make_proxy: ProxyFactory,
    recording_upstream: Upstream,
    coding: bytes,
    path: bytes,
    anthropic: bool,
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    head = [b"Content-Encoding: " + coding]
    answer = send_raw(proxy.url, b"POST " + path + b" HTTP/1.1", head, b"\x28\xb5\x2f\xfd")
    # Before: aiohttp's parser tried it (a 400 "could not be decoded"), or inflated a
    # second gzip layer the proxy had never checked.
    assert status_of(answer) == 415, answer[:300]
    error = error_of(answer)
    message = str(error["message"])
    assert "not supported" in message
    assert "gzip" in message
    assert "deflate" in message
    assert "identity" in message
    if anthropic:
        assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["type"] == "error"
    else:
        assert error["code"] == "unsupported_content_encoding"
    assert seen == []


def test_an_unsupported_coding_announced_with_expect_is_refused_before_the_body(
    make_proxy: ProxyFactory, recording_upstream: Upstream
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    host, port = proxy.url.removeprefix("http://").split(":")
    head = [
        b"POST /v1/chat/completions HTTP/1.1",
        b"Host: proxy",
        b"Content-Length: 100",
        b"Content-Encoding: br",
        b"Expect: 100-continue",
    ]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n")
        data = sock.recv(65536)  # the refusal, and no `100 Continue` before it
        while b"}}" not in data:
            data += sock.recv(65536)
    assert status_of(data) == 415, data[:300]
    assert b"connection: close" in data.partition(b"\r\n\r\n")[0].lower()
    assert error_of(data)["code"] == "unsupported_content_encoding"
    assert seen == []


def _two_members(data: bytes) -> bytes:
    return gzip.compress(data[:20]) + gzip.compress(data[20:])


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (gzip.compress(CHAT_BODY)[:-6], 400),  # cut short
        (gzip.compress(CHAT_BODY) + b"trailing", 400),  # bytes after the stream's end
        (zlib.compress(CHAT_BODY) + b"\x00", 400),
        (b"\x1f\x8b" + b"\x00" * 30, 400),  # a gzip magic, then garbage
        (_two_members(CHAT_BODY), 200),  # `cat a.gz b.gz`: one body
    ],
    ids=["truncated", "trailing-bytes", "deflate-trailing", "garbage", "two-members"],
)
def test_a_broken_stream_is_a_400_and_members_join(
    make_proxy: ProxyFactory, recording_upstream: Upstream, body: bytes, status: int
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    coding = b"deflate" if body.startswith(b"\x78") else b"gzip"
    head = [b"Content-Encoding: " + coding]
    answer = send_raw(proxy.url, b"POST /v1/chat/completions HTTP/1.1", head, body)
    assert status_of(answer) == status, answer[:300]
    if status == 400:
        assert "could not be decoded" in str(error_of(answer)["message"])
        assert seen == []
    else:
        assert CHAT_BODY in [r.body for r in seen]


def test_a_body_of_many_gzip_members_is_refused_without_holding_the_loop(
    make_proxy: ProxyFactory, recording_upstream: Upstream
) -> None:
    """Thousands of empty members inflate to nothing, but zlib copied the rest of the body
    at each member's end: the square of its size, on the loop, before any output counted."""
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    many = gzip.compress(b"") * 200_000
    before = loop_cpu(proxy)
    answer = send_raw(
        proxy.url, b"POST /v1/chat/completions HTTP/1.1", [b"Content-Encoding: gzip"], many
    )
    assert status_of(answer) == 400
    assert "more than 64 gzip members" in str(error_of(answer)["message"])
    assert seen == []
    # The refusal came at the 65th member: far less CPU than inflating 200,000 of them
    # (about 10 s on the loop before), whatever else the machine is doing.
    assert loop_cpu(proxy) - before < inflating_cost()
    # Up to the bound, members still join: the body is the members' bytes in order.
    parts = [CHAT_BODY[i : i + 2] for i in range(0, len(CHAT_BODY), 2)][:63]
    rest = CHAT_BODY[sum(map(len, parts)) :]
    joined = b"".join(gzip.compress(p) for p in (*parts, rest))
    answer = send_raw(
        proxy.url, b"POST /v1/chat/completions HTTP/1.1", [b"Content-Encoding: gzip"], joined
    )
    assert status_of(answer) == 200, answer[:300]
    assert CHAT_BODY in [r.body for r in seen]
