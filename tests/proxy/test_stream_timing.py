"""A streamed answer through the proxy is relayed chunk by chunk, never buffered.

The upstream runs in lockstep with the client: it sends chunk k+1 only once the client (the
official SDK, through the proxy) has received chunk k. A proxy that held back even one chunk
would stall the exchange, which the upstream reports; no clock is read, so a busy machine
cannot make this pass or fail. The timing figures (gaps, first chunk, spread against a direct
call) are in benchmarks/stream_relay_timing.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from proxy_support import HOSTED_MODEL, ProxyFactory, RunningProxy
from sse_chunks import chat_chunk

from kvmigrate.proxy import forward
from kvmigrate.proxy.forward import END_GRACE_S
from kvmigrate.serving import BackgroundServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CHUNKS = 12
# How long the upstream waits for the client to see a chunk before it calls that a stall.
# The quiet-machine figure is about a millisecond; a buffering proxy never delivers.
STALL_S = 20.0


@dataclass
class Lockstep:
    received: list[threading.Event] = field(
        default_factory=lambda: [threading.Event() for _ in range(CHUNKS)]
    )
    stalled: list[int] = field(default_factory=list)
    sent: int = 0


def chunk(content: str | None, finish: str | None = None) -> bytes:
    return chat_chunk({"content": content} if content is not None else {}, finish)


@contextmanager
def chat_upstream(handle: Handler) -> Iterator[BackgroundServer]:
    """A scripted upstream: `handle` answers its chat completions."""

    def make() -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        return app

    with BackgroundServer(make) as server:
        yield server


@pytest.fixture
def lockstep_upstream() -> Iterator[tuple[BackgroundServer, Lockstep]]:
    state = Lockstep()

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for k in range(CHUNKS):
            state.sent = k + 1  # before the write: the client may see the chunk at once
            await response.write(chunk(f"w{k} "))
            if not await asyncio.to_thread(state.received[k].wait, STALL_S):
                state.stalled.append(k)
        await response.write(chunk(None, "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    with chat_upstream(handle) as server:
        yield server, state


def test_chunks_are_relayed_as_they_arrive(
    make_proxy: ProxyFactory, lockstep_upstream: tuple[BackgroundServer, Lockstep]
) -> None:
    upstream, state = lockstep_upstream
    proxy = make_proxy(rollout="{mode: split, percent: 100}", vllm_url=upstream.url)
    stream = proxy.client().chat.completions.create(
        model=HOSTED_MODEL,
        messages=[{"role": "user", "content": "Explain prefix caching."}],
        stream=True,
    )
    seen: list[str] = []
    sent_when_seen: list[int] = []
    for part in stream:
        if part.choices and part.choices[0].delta.content:
            seen.append(part.choices[0].delta.content)
            sent_when_seen.append(state.sent)
            state.received[len(seen) - 1].set()
    assert state.stalled == [], f"chunks {state.stalled} did not reach the client on their own"
    assert seen == [f"w{k} " for k in range(CHUNKS)]
    # Each chunk reached the client while it was the last one the upstream had sent.
    assert sent_when_seen == list(range(1, CHUNKS + 1))


# How long the upstream keeps its body open after `data: [DONE]`.
END_AFTER_DONE_S = 0.5
# An end well past the proxy's grace for it, and before the candidate's read timeout (2 s),
# which would end the stream too.
LATE_END_S = 1.5
assert END_GRACE_S * 4 < LATE_END_S
# The headers that shape its answer, let through to it (the candidate's allowlist).
SHAPE_HEADERS = ", candidate_headers: [x-split, x-end-after]"


@pytest.fixture
def patient_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """`data: [DONE]` waits for the upstream's end however late it is, so that a busy
    machine cannot release it first (the release has a test of its own)."""
    monkeypatch.setattr(forward, "END_GRACE_S", 60.0)


@pytest.fixture
def slow_end_upstream() -> Iterator[tuple[BackgroundServer, threading.Event]]:
    """A stream whose body ends a while after its `data: [DONE]` (`x-end-after` seconds):
    in one write with the content (`x-split: no`), or written on its own after it."""
    ended = threading.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        content = chunk("all of it") + chunk(None, "stop")
        if request.headers.get("x-split") == "no":
            await response.write(content + b"data: [DONE]\n\n")
        else:
            await response.write(content)
            await asyncio.sleep(0.05)
            await response.write(b"data: [DONE]\n\n")
        await asyncio.sleep(float(request.headers.get("x-end-after", END_AFTER_DONE_S)))
        ended.set()
        await response.write_eof()
        return response

    with chat_upstream(handle) as server:
        yield server, ended


@pytest.fixture
def slow_end(
    make_proxy: ProxyFactory, slow_end_upstream: tuple[BackgroundServer, threading.Event]
) -> tuple[RunningProxy, threading.Event]:
    """A proxy whose every chat goes to the slow-ending upstream, and the upstream's end."""
    upstream, ended = slow_end_upstream
    proxy = make_proxy(
        rollout="{mode: split, percent: 100}", vllm_url=upstream.url, vllm_extra=SHAPE_HEADERS
    )
    return proxy, ended


QUESTION = {
    "model": HOSTED_MODEL,
    "messages": [{"role": "user", "content": "Explain prefix caching."}],
    "stream": True,
}


def streamed_text(proxy: RunningProxy, headers: dict[str, str]) -> str:
    """The answer's text through the SDK, which stops reading at `data: [DONE]`."""
    stream = proxy.client().chat.completions.create(**QUESTION, extra_headers=headers)
    return "".join(part.choices[0].delta.content or "" for part in stream if part.choices)


@pytest.mark.parametrize("split", ["yes", "no"])
def test_a_client_has_done_only_once_the_proxy_has_the_end(
    patient_proxy: None, slow_end: tuple[RunningProxy, threading.Event], split: str
) -> None:
    """The SDK stops at `data: [DONE]` and sends its next turn: by then the proxy has read
    the upstream's end, counted the answer and stored its links (the shadow copy too)."""
    proxy, ended = slow_end
    text = streamed_text(proxy, {"x-split": split})
    assert ended.is_set(), "the client had data: [DONE] before the upstream's end"
    assert proxy.metric("kvmigrate_requests_total", role="serve") == 1
    assert text == "all of it"


def test_a_client_that_leaves_before_done_is_recorded_as_gone(
    patient_proxy: None, slow_end: tuple[RunningProxy, threading.Event]
) -> None:
    """The held `data: [DONE]` is the stream's last write: a client gone by then is a
    client that left, as at any other write, not an answer it had whole."""
    proxy, ended = slow_end
    create = proxy.client().chat.completions.with_streaming_response.create
    with create(**QUESTION) as response:
        for part in response.parse():
            if part.choices and part.choices[0].delta.content:
                break  # leaves with the content, before the upstream's end
    assert not ended.is_set()
    deadline = time.monotonic() + 10
    while proxy.metric("kvmigrate_errors_total", error="client_disconnected") < 1:
        assert time.monotonic() < deadline, "the client's leaving was not recorded"
        time.sleep(0.05)
    assert ended.is_set()


@pytest.mark.parametrize("split", ["yes", "no"])
def test_an_upstream_late_to_end_its_body_does_not_keep_done_from_the_client(
    slow_end: tuple[RunningProxy, threading.Event], split: str
) -> None:
    """`data: [DONE]` waits for the upstream's end only END_GRACE_S: the client has its
    whole answer while the upstream is still holding its body open."""
    proxy, ended = slow_end
    text = streamed_text(proxy, {"x-split": split, "x-end-after": str(LATE_END_S)})
    assert text == "all of it"
    assert not ended.is_set(), "the client had data: [DONE] only with the upstream's end"
