"""A very long streamed tool call through the proxy (an agent writing a file: tens of
thousands of argument deltas, more bytes than an exchange keeps): relayed whole to the
client, and its shadow copy judged by its events, not by the gap where the proxy stopped
keeping them."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import pytest
from aiohttp import web
from proxy_support import HOSTED_MODEL, ProxyFactory, RunningProxy
from sse_chunks import chat_chunk

from kvmigrate.serving import BackgroundServer
from kvmigrate.wire.chunk_log import MAX_RECORDED_BYTES

DELTAS = 40_000
PIECE = "ab cd " * 30  # bigger events: the stream is 17 MB, twice what is kept
ASK = [{"role": "user", "content": "Write the file report.txt"}]


@functools.cache
def tool_call_stream() -> bytes:
    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "write"}}
    events = [chat_chunk({"role": "assistant", "tool_calls": [head]})]  # type: ignore[dict-item]
    piece = {"tool_calls": [{"index": 0, "function": {"arguments": PIECE}}]}
    events += [chat_chunk(piece)] * DELTAS  # type: ignore[arg-type]
    events.append(chat_chunk({}, "tool_calls"))
    body = b"".join(events) + b"data: [DONE]\n\n"
    assert len(body) > MAX_RECORDED_BYTES  # the exchange keeps its head and its tail
    return body


@pytest.fixture
def long_streamer() -> Iterator[BackgroundServer]:
    """An upstream that streams the long tool call in writes of an odd size, as a network
    cuts a stream: a chunk the proxy reads ends anywhere, mid-line too."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        body = tool_call_stream()
        for start in range(0, len(body), 4093):
            await response.write(body[start : start + 4093])
        await response.write_eof()
        return response

    def make() -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        return app

    with BackgroundServer(make) as server:
        yield server


def wait_for_shadow(proxy: RunningProxy, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while proxy.metric("kvmigrate_requests_total", role="shadow") < 1:
        assert time.monotonic() < deadline, "the shadow copy was never counted"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_long_tool_call_is_relayed_whole_and_its_copy_judged_well_formed(
    make_proxy: ProxyFactory, long_streamer: BackgroundServer
) -> None:
    proxy = make_proxy(
        "{mode: shadow, noise_sample: 0}", hosted_url=long_streamer.url, vllm_url=long_streamer.url
    )
    stream = proxy.client(timeout=120).chat.completions.create(
        model=HOSTED_MODEL, messages=ASK, stream=True
    )
    deltas: list[str] = []
    for chunk in stream:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if call.function is not None and call.function.arguments:
                deltas.append(call.function.arguments)
    assert deltas == [PIECE] * DELTAS
    wait_for_shadow(proxy)
    # Before: the copy's bytes past MAX_RECORDED_BYTES were dropped from its middle, and
    # the check read the head and the tail joined, a line cut in two: malformed_stream.
    assert proxy.metric("kvmigrate_errors_total", role="shadow") == 0
    assert proxy.metric("kvmigrate_requests_total", role="shadow", status="200") == 1
