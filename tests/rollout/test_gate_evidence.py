"""The gates read their evidence from real records: the noise pairs a parity verdict lacks
and the span the evidence arrived over come from the records database."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvmigrate.config import load_config, parse_config
from kvmigrate.parity.noise import NoiseSettings
from kvmigrate.parity.recording import CANDIDATE_KIND, NOISE_KIND
from kvmigrate.policies.gates import GateConfig, evaluate_gates
from kvmigrate.policies.split import in_shadow_sample
from kvmigrate.recorder import Record, open_store, window_stats


def _rec(i: int, backend: str, ts: float, kind: str | None, role: str) -> Record:
    return Record(
        request_id=f"{backend}-{kind}-{i}", ts=ts, route="chat/completions", backend=backend,
        role=role, model="m", served_model="m", conversation=f"c{i % 25}", turn=1 + i // 25,
        stream=True, status=200, ttft_ms=20.0, latency_ms=40.0, parity_kind=kind,
        parity_applicable=kind and '["text"]', parity_disagree=kind and "[]",
    )  # fmt: skip


def test_parity_gate_from_records_names_the_noise_pairs_missing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/records.db"
    start = time.time() - 600
    with open_store(url) as store:
        store.insert([_rec(i, "hosted", start + i, None, "serve") for i in range(100)])
        store.insert([_rec(i, "vllm", start + 6 * i, CANDIDATE_KIND, "shadow") for i in range(100)])
        store.insert([_rec(i, "hosted", start + 200 * i, NOISE_KIND, "noise") for i in range(4)])
    windows = window_stats(url, start - 1)
    candidate = windows["vllm"]
    assert (candidate.parity, candidate.parity_samples) == (None, 100)
    assert (candidate.noise_pairs, candidate.noise_needed) == (4, 20)
    assert 590 < candidate.span_s < 600
    gates = evaluate_gates(windows["hosted"], candidate, GateConfig(min_parity=0.9))
    [parity] = [g for g in gates if g.name == "parity"]
    assert "needs 20 primary-vs-primary pairs" in parity.detail
    assert "have 4" in parity.detail
    assert "rollout.noise_sample" in parity.detail
    assert parity.figures["noise_pairs"] == 4


def test_default_noise_sample_lets_a_minimum_pilot_reach_a_parity_verdict() -> None:
    """A pilot just big enough for the traffic gate (20 conversations, 100 requests) must
    also bring the noise pairs a parity verdict needs, with the defaults and with the
    example config, whichever conversations it happens to be."""
    example = load_config(Path(__file__).resolve().parents[2] / "config.yaml", env={})
    minimal = parse_config(
        "backends: {hosted: {api_base: 'https://h/v1'}, vllm: {api_base: 'http://v/v1'}}\n"
        "models: [{model_name: m, hosted: m, vllm: m}]\n",
        env={},
    )
    floor = NoiseSettings().min_noise_samples
    for config in (example, minimal):
        r, gates = config.rollout, config.rollout.gates
        turns = gates.min_requests // gates.min_conversations
        for pilot in range(10):
            keys = [f"pilot{pilot}-session-{i}" for i in range(gates.min_conversations)]
            sampled = [k for k in keys if in_shadow_sample(r.salt + "\x00noise", k, r.noise_sample)]
            assert len(sampled) * turns >= floor, (config.source, pilot, len(sampled))


def test_a_fast_failure_does_not_lower_the_latency_the_ttft_gate_reads(tmp_path: Path) -> None:
    """Non-streamed traffic has no TTFT, so the TTFT gate compares total latency: a
    candidate that answers half its calls with a 503 in 1 ms must not read as faster."""
    url = f"sqlite:///{tmp_path}/records.db"
    start = time.time() - 600

    def call(i: int, status: int, latency_ms: float) -> Record:
        return Record(
            request_id=f"vllm-{i}", ts=start + i, route="chat/completions", backend="vllm",
            role="serve", model="m", served_model="m", conversation=f"c{i}", turn=1,
            stream=False, status=status, ttft_ms=None, latency_ms=latency_ms,
            error=None if status < 400 else f"http_{status}",
        )  # fmt: skip

    with open_store(url) as store:
        store.insert([call(i, 200, 1000.0) for i in range(50)])
        store.insert([call(50 + i, 503, 1.0) for i in range(50)])
    candidate = window_stats(url, start - 1)["vllm"]
    assert candidate.errors == 50
    assert candidate.latency_p95 == pytest.approx(1.0)
    assert set(candidate.latency_sample) == {1.0}
