"""A client that gives up before the first byte: the upstream call stops, and it is evidence.
One that leaves mid-stream: the relay runs on to its next write, and that is evidence too.

A candidate slow enough that clients time out is exactly what the gates and auto-rollback
exist to catch, so its give-ups must leave rows and metrics and count against it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from aiohttp import web
from recorder_support import (
    HOSTED_MODEL,
    Backends,
    RecordingProxy,
    recorder_config,
    start_recording_proxy,
    wait_until,
)
from sse_chunks import chat_chunk

from kvmigrate.policies.gates import (
    GateConfig,
    RollbackConfig,
    Verdict,
    evaluate_gates,
    rollback_reason,
)
from kvmigrate.recorder import open_store
from kvmigrate.recorder.queries import window_stats
from kvmigrate.serving import BackgroundServer

CLIENTS = 6
CLIENT_TIMEOUT_S = 0.4


def chat_completions_app(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    return app


@contextmanager
def candidate_behind_recording_proxy(
    backends: Backends, candidate_app: Callable[[], web.Application], db: str
) -> Iterator[RecordingProxy]:
    """A recording proxy that sends every conversation to `candidate_app`'s server."""
    rollout = "{mode: split, percent: 100, noise_sample: 0, pinning: false}"
    with BackgroundServer(candidate_app) as candidate:
        config = recorder_config(backends.hosted.url, candidate.url, db, rollout=rollout)
        yield start_recording_proxy(config)


class SlowUpstream:
    """An upstream that never answers in time and notes when each call was abandoned."""

    def __init__(self) -> None:
        self.arrived: list[float] = []
        self.cancelled: list[float] = []

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            self.arrived.append(time.monotonic())
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.append(time.monotonic())
                raise
            return web.json_response({})

        return chat_completions_app(handle)


def test_a_client_that_gives_up_cancels_the_upstream_and_counts_against_it(
    backends: Backends, tmp_path: Path
) -> None:
    slow = SlowUpstream()
    db = f"sqlite:///{tmp_path}/records.db"
    with candidate_behind_recording_proxy(backends, slow.app, db) as proxy:
        client = openai.OpenAI(
            base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0, timeout=CLIENT_TIMEOUT_S
        )
        started = time.time()
        gave_up: list[float] = []
        for i in range(CLIENTS):
            with pytest.raises(openai.APITimeoutError):
                client.chat.completions.create(
                    model=HOSTED_MODEL,
                    messages=[{"role": "user", "content": f"question {i}"}],
                    extra_headers={"X-Session-ID": f"conv-{i}"},
                )
            gave_up.append(time.monotonic())
        client.close()
        wait_until(lambda: len(slow.cancelled) == CLIENTS)
        wait_until(lambda: proxy.recorder.stats.written >= CLIENTS)
        metrics = urllib.request.urlopen(proxy.url + "/metrics").read().decode()
        proxy.stop()

    # The upstream call ended with the client's, not 30 s later. (Typically a few ms; the
    # bound here leaves room for a loaded machine.)
    lags = [c - g for c, g in zip(slow.cancelled, gave_up, strict=True)]
    assert max(lags) < 2.0, lags
    assert (
        'kvmigrate_errors_total{backend="vllm",cohort="gpt-4o-mini",error="client_cancelled",'
        'role="serve"} 6.0' in metrics
    )

    with open_store(db) as store:
        rows = store.query("SELECT backend, role, status, error, ttft_ms, latency_ms FROM records")
        windows = window_stats(store, since=started - 1)
    assert len(rows) == CLIENTS
    for backend, role, status, error, ttft_ms, latency_ms in rows:
        assert (backend, role, status, error, ttft_ms) == (
            "vllm",
            "serve",
            None,
            "client_cancelled",
            None,
        )
        assert latency_ms > 0  # how long the client waited for it

    candidate_window = windows["vllm"]
    assert (candidate_window.requests, candidate_window.errors) == (CLIENTS, CLIENTS)
    gates = evaluate_gates(
        windows.get("hosted") or type(candidate_window)("hosted"),
        candidate_window,
        GateConfig(min_requests=CLIENTS, min_conversations=CLIENTS),
    )
    assert {g.name: g.verdict for g in gates}["error_rate"] is Verdict.FAILED
    reason = rollback_reason(
        type(candidate_window)("hosted"), candidate_window, RollbackConfig(min_requests=CLIENTS)
    )
    assert reason is not None
    assert "error rate" in reason


class PausedStream:
    """An upstream that streams one content chunk, then the rest once `resume` is set."""

    def __init__(self) -> None:
        self.resume = threading.Event()
        self.finished = threading.Event()

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(chat_chunk({"role": "assistant", "content": "one"}))
            await asyncio.to_thread(self.resume.wait, 10)
            for word in (" two", " three"):
                await response.write(chat_chunk({"content": word}))
            await response.write(b"data: [DONE]\n\n")
            self.finished.set()
            return response

        return chat_completions_app(handle)


def test_a_client_that_leaves_mid_stream_is_recorded_as_disconnected(
    backends: Backends, tmp_path: Path
) -> None:
    """From the first byte on, the proxy's relay runs to its next write after the client
    left (aiohttp would cancel it at the disconnect), so the answer still leaves a record:
    the status and time to first byte it had, and the client's disconnect as its error."""
    upstream = PausedStream()
    db = f"sqlite:///{tmp_path}/records.db"
    with candidate_behind_recording_proxy(backends, upstream.app, db) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)
        stream = client.chat.completions.create(
            model=HOSTED_MODEL, messages=[{"role": "user", "content": "count"}], stream=True
        )
        assert next(iter(stream)).choices[0].delta.content == "one"
        stream.close()  # the client leaves with the stream half read
        client.close()
        upstream.resume.set()
        assert upstream.finished.wait(10), "the upstream's answer was cut off"
        wait_until(lambda: proxy.recorder.stats.written >= 1)
        proxy.stop()

    with open_store(db) as store:
        rows = store.query("SELECT backend, role, status, error, ttft_ms FROM records")
    assert len(rows) == 1
    backend, role, status, error, ttft_ms = rows[0]
    assert (backend, role, status, error) == ("vllm", "serve", 200, "client_disconnected")
    assert ttft_ms is not None  # the first byte it had is part of its record
