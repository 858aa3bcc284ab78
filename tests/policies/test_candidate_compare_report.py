"""What a comparison of two candidates reports, exactly, on each measure: the detail line
`rollout status` prints, the estimate of a minus b, its interval, the leader and the
conversations still needed; seeded samples, so the figures are fixed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from gate_rows import rounded, spread

from kvmigrate.policies.candidate_compare import (
    error_rate_difference,
    parity_difference,
    ttft_p50_difference,
)
from kvmigrate.policies.gate_model import GateConfig
from kvmigrate.policies.window import BackendWindow as W
from kvmigrate.policies.window import ComparatorCounts as C

CONFIG = GateConfig(min_requests=100, min_parity_samples=30)
ROWS: list[tuple[str, Any, W, W, dict[str, Any]]] = [
    (
        "error rate: a leads",
        error_rate_difference,
        W("vllm", requests=2003, conversations=200, errors=5),
        W("sglang", requests=1999, conversations=200, errors=61),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "error_rate",
            "lead": "a_better",
            "detail": "vllm 0.25% - sglang 3.05% = -2.80 pts [-4.38 pts, -1.52 pts]: vllm better",
            "estimate": -0.028019,
            "low": -0.04379299967170376,
            "high": -0.015222014699738417,
            "needed_conversations": None,
        },
    ),
    (
        "error rate: undecided, more needed",
        error_rate_difference,
        W("vllm", requests=301, conversations=30, span_s=600, errors=7),
        W("sglang", requests=299, conversations=30, errors=3),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "error_rate",
            "lead": "undecided",
            "detail": "vllm 2.33% - sglang 1.00% = +1.32 pts [-2.83 pts, +5.90 pts]: undecided; about 191 more conversations each at the observed rates",
            "estimate": 0.013222,
            "low": -0.028279514461561718,
            "high": 0.05895526562326392,
            "needed_conversations": 191,
        },
    ),
    (
        "error rate: too few",
        error_rate_difference,
        W("vllm", requests=99, conversations=10, errors=1),
        W("sglang", requests=300, conversations=30),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "error_rate",
            "lead": "undecided",
            "detail": "need 100 requests of each (rollout.gates.min_requests); have 99 and 300",
            "estimate": None,
            "low": None,
            "high": None,
            "needed_conversations": None,
        },
    ),
    (
        "ttft: b leads",
        ttft_p50_difference,
        W("vllm", requests=400, conversations=40, ttft_sample=spread(400, 0.2, 0.4, 1)),
        W("sglang", requests=400, conversations=40, ttft_sample=spread(400, 0.1, 0.3, 2)),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "ttft_p50",
            "lead": "b_better",
            "detail": "vllm TTFT p50 298 ms - sglang 202 ms = +96 ms [+72 ms, +114 ms]: sglang better",
            "estimate": 96.15,
            "low": 71.8293811756362,
            "high": 113.9593374385461,
            "needed_conversations": None,
        },
    ),
    (
        "ttft: undecided",
        ttft_p50_difference,
        W("vllm", requests=150, conversations=15, span_s=300, ttft_sample=spread(150, 0.2, 0.4, 1)),
        W("sglang", requests=150, conversations=15, ttft_sample=spread(150, 0.19, 0.41, 2)),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "ttft_p50",
            "lead": "undecided",
            "detail": "vllm TTFT p50 299 ms - sglang 304 ms = -4 ms [-44 ms, +29 ms]: undecided; about 406 more conversations each at the observed rates",
            "estimate": -4.45,
            "low": -43.86944317212,
            "high": 29.380496597005518,
            "needed_conversations": 406,
        },
    ),
    (
        "latency when one side never streamed",
        ttft_p50_difference,
        W(
            "vllm",
            requests=400,
            conversations=40,
            ttft_sample=spread(400, 0.2, 0.4, 1),
            latency_sample=spread(400, 1.0, 2.0, 3),
        ),
        W("sglang", requests=400, conversations=40, latency_sample=spread(400, 1.5, 2.5, 4)),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "ttft_p50",
            "lead": "a_better",
            "detail": "vllm latency p50 1507 ms - sglang 2010 ms = -503 ms [-636 ms, -374 ms]: vllm better",
            "estimate": -503.35,
            "low": -635.974705466214,
            "high": -374.24321280428376,
            "needed_conversations": None,
        },
    ),
    (
        "ttft: no sample",
        ttft_p50_difference,
        W("vllm", requests=400, conversations=40),
        W("sglang", requests=400, conversations=40),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "ttft_p50",
            "lead": "undecided",
            "detail": "no latency p50 recorded yet for vllm or sglang",
            "estimate": None,
            "low": None,
            "high": None,
            "needed_conversations": None,
        },
    ),
    (
        "parity: a leads",
        parity_difference,
        W(
            "vllm",
            conversations=80,
            comparators=(C("exact", 400, 4, 0, 0), C("judge", 100, 1, 0, 0)),
        ),
        W(
            "sglang",
            conversations=80,
            comparators=(C("exact", 400, 60, 0, 0), C("embed", 100, 50, 0, 0)),
        ),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "parity",
            "lead": "a_better",
            "detail": "vllm parity 0.990 - sglang 0.850 = +0.140 [+0.080, +0.208]: vllm better",
            "estimate": 0.14,
            "low": 0.08038682040945652,
            "high": 0.20813794726214757,
            "needed_conversations": None,
        },
    ),
    (
        "parity: undecided",
        parity_difference,
        W("vllm", conversations=30, span_s=900, comparators=(C("exact", 60, 3, 0, 0),)),
        W("sglang", conversations=30, comparators=(C("exact", 70, 5, 0, 0),)),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "parity",
            "lead": "undecided",
            "detail": "vllm parity 0.950 - sglang 0.929 = +0.021 [-0.148, +0.180]: undecided; about 1492 more conversations each at the observed rates",
            "estimate": 0.021429,
            "low": -0.147934223097287,
            "high": 0.17985163188763453,
            "needed_conversations": 1492,
        },
    ),
    (
        "parity: too few in common",
        parity_difference,
        W("vllm", comparators=(C("exact", 400, 4, 0, 0),)),
        W("sglang", comparators=(C("judge", 400, 4, 0, 0),)),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "parity",
            "lead": "undecided",
            "detail": "need 30 scored pairs of each (rollout.gates.min_parity_samples) on common comparators; have 0 and 0",
            "estimate": None,
            "low": None,
            "high": None,
            "needed_conversations": None,
        },
    ),
    (
        "error rate: exactly the minimum",
        error_rate_difference,
        W("vllm", requests=100, conversations=10, errors=1),
        W("sglang", requests=100, conversations=10, errors=30),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "error_rate",
            "lead": "a_better",
            "detail": "vllm 1.00% - sglang 30.00% = -29.00 pts [-44.13 pts, -14.11 pts]: vllm better",
            "estimate": -0.29,
            "low": -0.44130477581478555,
            "high": -0.14107729871947136,
            "needed_conversations": None,
        },
    ),
    (
        "ttft: exactly the minimum",
        ttft_p50_difference,
        W("vllm", requests=100, conversations=10, ttft_sample=spread(100, 0.1, 0.2, 1)),
        W("sglang", requests=100, conversations=10, ttft_sample=spread(100, 0.3, 0.4, 2)),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "ttft_p50",
            "lead": "a_better",
            "detail": "vllm TTFT p50 151 ms - sglang 355 ms = -204 ms [-224 ms, -183 ms]: vllm better",
            "estimate": -204.15,
            "low": -223.853108891746,
            "high": -183.33191891648033,
            "needed_conversations": None,
        },
    ),
    (
        "ttft: too few requests",
        ttft_p50_difference,
        W("vllm", requests=99, conversations=10, ttft_sample=spread(99, 0.1, 0.2, 1)),
        W("sglang", requests=100, conversations=10, ttft_sample=spread(100, 0.3, 0.4, 2)),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "ttft_p50",
            "lead": "undecided",
            "detail": "need 100 requests of each (rollout.gates.min_requests); have 99 and 100",
            "estimate": None,
            "low": None,
            "high": None,
            "needed_conversations": None,
        },
    ),
    (
        "latency: one side has none",
        ttft_p50_difference,
        W("vllm", requests=400, conversations=40, ttft_sample=spread(400, 0.2, 0.4, 1)),
        W("sglang", requests=400, conversations=40, latency_sample=spread(400, 1.5, 2.5, 4)),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "ttft_p50",
            "lead": "undecided",
            "detail": "no latency p50 recorded yet for vllm",
            "estimate": None,
            "low": None,
            "high": None,
            "needed_conversations": None,
        },
    ),
    (
        "parity: exactly the minimum",
        parity_difference,
        W("vllm", conversations=10, comparators=(C("exact", 30, 0, 0, 0),)),
        W("sglang", conversations=10, comparators=(C("exact", 30, 20, 0, 0),)),
        {
            "a": "vllm",
            "b": "sglang",
            "measure": "parity",
            "lead": "a_better",
            "detail": "vllm parity 1.000 - sglang 0.333 = +0.667 [+0.308, +0.859]: vllm better",
            "estimate": 0.666667,
            "low": 0.3080231903330385,
            "high": 0.8593327173191176,
            "needed_conversations": None,
        },
    ),
]


@pytest.mark.parametrize(
    ("measure", "a", "b", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_each_measure_reports_the_difference_its_interval_and_the_leader(
    measure: Any, a: W, b: W, expected: dict[str, Any]
) -> None:
    got = measure(a, b, CONFIG)
    assert rounded({**dataclasses.asdict(got), "lead": got.lead.value}) == rounded(expected)
    assert got.leader == {"a_better": a.backend, "b_better": b.backend}.get(expected["lead"])
