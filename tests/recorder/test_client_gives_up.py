"""A client that gives up before the first byte: the upstream call stops, and it is evidence.

A candidate slow enough that clients time out is exactly what the gates and auto-rollback
exist to catch, so its give-ups must leave rows and metrics and count against it.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from aiohttp import web
from recorder_support import (
    HOSTED_MODEL,
    Backends,
    recorder_config,
    start_recording_proxy,
    wait_until,
)

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

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        return app


def test_a_client_that_gives_up_cancels_the_upstream_and_counts_against_it(
    backends: Backends, tmp_path: Path
) -> None:
    slow = SlowUpstream()
    db = f"sqlite:///{tmp_path}/records.db"
    rollout = "{mode: split, percent: 100, noise_sample: 0, pinning: false}"
    with BackgroundServer(slow.app) as candidate:
        config = recorder_config(backends.hosted.url, candidate.url, db, rollout=rollout)
        proxy = start_recording_proxy(config)
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
