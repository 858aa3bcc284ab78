"""What each gate reports, exactly: the detail line an operator reads, the figures and the
interval that `kvmigrate rollout status` and the report print. Rows computed once and
checked by hand against the counts (the rates, their rounding, the signed points); the
intervals are the sequential Wilson / Newcombe ones (tests/policies/test_sequential.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from kvmigrate.intervals import Interval
from kvmigrate.policies.error_gate import error_gate
from kvmigrate.policies.gate_model import (
    GateResult,
    bounds,
    duration,
    eta,
    still_needed,
    too_few_requests,
)
from kvmigrate.policies.gates import (
    GateConfig,
    RollbackConfig,
    Verdict,
    evaluate_gates,
    gate_summary,
    render_gates,
    rollback_reason,
)
from kvmigrate.policies.window import BackendWindow as W

ERROR_ROWS: list[tuple[str, W, W, GateConfig, Verdict, str, dict[str, Any], tuple[Any, ...]]] = [
    (
        "decided",
        W("p", requests=2003, conversations=100, errors=21),
        W("c", requests=601, conversations=40, errors=7),
        GateConfig(error_rate_margin=0.05, min_requests=300),
        Verdict.PASSED,
        "candidate 1.16% - primary 1.05% = +0.12 pts [-1.16 pts, +2.45 pts] vs margin +5.00 pts (rollout.gates.error_rate_margin)",
        {
            "candidate_error_rate": 0.01165,
            "primary_error_rate": 0.01048,
            "candidate_errors": 7,
            "candidate_requests": 601,
            "primary_errors": 21,
            "primary_requests": 2003,
            "margin": 0.05,
        },
        (0.00116, -0.011594770803532044, 0.02450887808001377, 0.05, None),
    ),
    (
        "waiting",
        W("p", requests=2000, conversations=100, errors=20),
        W("c", requests=401, conversations=40, errors=13),
        GateConfig(),
        Verdict.INCONCLUSIVE,
        "candidate 3.24% - primary 1.00% = +2.24 pts [+0.12 pts, +6.34 pts] vs margin +1.00 pts (rollout.gates.error_rate_margin); about 132 more conversations at the observed rates",
        {
            "candidate_error_rate": 0.03242,
            "primary_error_rate": 0.01,
            "candidate_errors": 13,
            "candidate_requests": 401,
            "primary_errors": 20,
            "primary_requests": 2000,
            "margin": 0.01,
        },
        (0.02242, 0.0012056076137334781, 0.06338916913120048, 0.01, 132),
    ),
    (
        "no primary",
        W("p"),
        W("c", requests=301, conversations=30, errors=3),
        GateConfig(error_rate_margin=0.05, min_requests=300),
        Verdict.PASSED,
        "candidate 1.00% - primary 0.00% = +1.00 pts [+0.21 pts, +4.70 pts] vs margin +5.00 pts (rollout.gates.error_rate_margin)",
        {
            "candidate_error_rate": 0.00997,
            "primary_error_rate": 0.0,
            "candidate_errors": 3,
            "candidate_requests": 301,
            "primary_errors": 0,
            "primary_requests": 0,
            "margin": 0.05,
        },
        (0.00997, 0.002051333450400452, 0.04698731232168983, 0.05, None),
    ),
    (
        "too few",
        W("p", requests=10),
        W("c", requests=21, conversations=5, errors=1),
        GateConfig(),
        Verdict.INCONCLUSIVE,
        "need 100 candidate requests (rollout.gates.min_requests) before an error rate counts; have 21",
        {
            "candidate_error_rate": 0.04762,
            "primary_error_rate": 0.0,
            "candidate_errors": 1,
            "candidate_requests": 21,
            "primary_errors": 0,
            "primary_requests": 10,
            "margin": 0.01,
        },
        (None, None, None, 0.01, None),
    ),
    (
        "one request, no primary",
        W("p"),
        W("c", requests=1, conversations=1, errors=1),
        GateConfig(min_requests=1, error_rate_margin=0.999),
        Verdict.INCONCLUSIVE,
        "candidate 100.00% - primary 0.00% = +100.00 pts [+9.79 pts, +100.00 pts] vs margin +99.90 pts (rollout.gates.error_rate_margin); the estimate is too close to the threshold to say how much more traffic it needs",
        {
            "candidate_error_rate": 1.0,
            "primary_error_rate": 0.0,
            "candidate_errors": 1,
            "candidate_requests": 1,
            "primary_errors": 0,
            "primary_requests": 0,
            "margin": 0.999,
        },
        (1.0, 0.09791927786428878, 1.0, 0.999, None),
    ),
    (
        "one request each",
        W("p", requests=1, conversations=1),
        W("c", requests=1, conversations=1, errors=1),
        GateConfig(min_requests=1, error_rate_margin=0.999),
        Verdict.INCONCLUSIVE,
        "candidate 100.00% - primary 0.00% = +100.00 pts [-27.57 pts, +100.00 pts] vs margin +99.90 pts (rollout.gates.error_rate_margin); the estimate is too close to the threshold to say how much more traffic it needs",
        {
            "candidate_error_rate": 1.0,
            "primary_error_rate": 0.0,
            "candidate_errors": 1,
            "candidate_requests": 1,
            "primary_errors": 0,
            "primary_requests": 1,
            "margin": 0.999,
        },
        (1.0, -0.2757347915996382, 1.0, 0.999, None),
    ),
]


@pytest.mark.parametrize(
    ("primary", "candidate", "config", "verdict", "detail", "figures", "numbers"),
    [r[1:] for r in ERROR_ROWS],
    ids=[r[0] for r in ERROR_ROWS],
)
def test_the_error_gate_reports_its_counts_interval_and_what_it_still_needs(
    primary: W,
    candidate: W,
    config: GateConfig,
    verdict: Verdict,
    detail: str,
    figures: dict[str, Any],
    numbers: tuple[Any, ...],
) -> None:
    got = error_gate(primary, candidate, config)
    assert (got.name, got.verdict, got.detail, got.figures) == (
        "error_rate",
        verdict,
        detail,
        figures,
    )
    estimate, low, high, threshold, needed = numbers
    assert got.estimate == estimate
    assert got.low == (None if low is None else pytest.approx(low, rel=1e-9))
    assert got.high == (None if high is None else pytest.approx(high, rel=1e-9))
    assert (got.threshold, got.needed_conversations) == (threshold, needed)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (89.4, "89 s"), (90, "2 min"), (90.5, "2 min"), (5399, "90 min"),
     (5400, "1.5 h"), (3_600_000, "1000.0 h")],
)  # fmt: skip
def test_durations_in_seconds_minutes_or_hours(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("have", "need", "span_s", "text"),
    [
        (10, 10, 100, ""),  # nothing missing
        (11, 10, 100, ""),
        (5, 10, 0.5, ""),  # under a second of traffic: no rate to speak of
        (5, 10, 1.0, "; at the current rate (1 s so far) about 1 s more"),
        (5, 10, 1.5, "; at the current rate (2 s so far) about 2 s more"),
        (0, 10, 60, "; none in the last 60 s"),
        (20, 30, 600, "; at the current rate (10 min so far) about 5 min more"),
    ],
)
def test_eta_at_the_rate_evidence_arrived(
    have: float, need: float, span_s: float, text: str
) -> None:
    assert eta(have, need, span_s) == text


@pytest.mark.parametrize(
    ("more", "span_s", "text"),
    [
        (None, 100, "; the estimate is too close to the threshold to say how much more traffic it needs"),
        (1, 100, "; about 1 more conversation at the observed rates"
                 "; at the current rate (2 min so far) about 10 s more"),
        (2, 120, "; about 2 more conversations at the observed rates"
                 "; at the current rate (2 min so far) about 24 s more"),
        (0, 120, "; about 0 more conversations at the observed rates"),
    ],
)  # fmt: skip
def test_still_needed_says_how_many_more_conversations_and_how_long(
    more: int | None, span_s: float, text: str
) -> None:
    assert still_needed(W("c", conversations=10, span_s=span_s), more) == text


def test_too_few_requests_says_how_many_and_how_long() -> None:
    candidate = W("c", requests=50, span_s=600)
    assert too_few_requests(candidate, GateConfig(min_requests=100), "a p95") == (
        "need 100 candidate requests (rollout.gates.min_requests) before a p95 counts; have 50"
        "; at the current rate (10 min so far) about 10 min more"
    )


def test_a_result_as_json_has_no_infinite_bounds() -> None:
    assert bounds(Interval(-math.inf, 0.5)) == {"low": None, "high": 0.5}
    assert bounds(Interval(0.1, math.inf)) == {"low": 0.1, "high": None}
    result = GateResult("x", Verdict.FAILED, "d", {"k": 1}, 0.2, 0.1, None, 0.05, 3)
    assert result.to_dict() == {
        "name": "x",
        "verdict": "failed",
        "detail": "d",
        "estimate": 0.2,
        "interval": [0.1, None],
        "threshold": 0.05,
        "needed_conversations": 3,
        "figures": {"k": 1},
    }


TRAFFIC = GateConfig(min_requests=300, min_conversations=30)


@pytest.mark.parametrize(
    ("candidate", "config", "verdict", "detail", "needed"),
    [
        (W("c", requests=300, conversations=30), TRAFFIC, "passed",
         "300 requests in 30 conversations", None),
        (W("c", requests=5, conversations=3), GateConfig(min_requests=0, min_conversations=0),
         "passed", "5 requests in 3 conversations", None),
        # No request minimum: the conversations alone set the wait.
        (W("c", requests=5, conversations=3, span_s=60), GateConfig(min_requests=0),
         "inconclusive",
         "need 0 candidate requests (rollout.gates.min_requests) in 20 conversations "
         "(rollout.gates.min_conversations); have 5 in 3"
         "; at the current rate (60 s so far) about 6 min more", 17),
        # The count furthest behind, as a share of its threshold, sets the wait.
        (W("c", requests=150, conversations=30, span_s=600), TRAFFIC, "inconclusive",
         "need 300 candidate requests (rollout.gates.min_requests) in 30 conversations "
         "(rollout.gates.min_conversations); have 150 in 30"
         "; at the current rate (10 min so far) about 10 min more", 0),
        (W("c", requests=600, conversations=10, span_s=600), TRAFFIC, "inconclusive",
         "need 300 candidate requests (rollout.gates.min_requests) in 30 conversations "
         "(rollout.gates.min_conversations); have 600 in 10"
         "; at the current rate (10 min so far) about 20 min more", 20),
        (W("c", span_s=600), TRAFFIC, "inconclusive",
         "need 300 candidate requests (rollout.gates.min_requests) in 30 conversations "
         "(rollout.gates.min_conversations); have 0 in 0; none in the last 10 min", 30),
    ],
)  # fmt: skip
def test_the_traffic_gate_reports_its_counts_and_the_wait(
    candidate: W, config: GateConfig, verdict: str, detail: str, needed: int | None
) -> None:
    got = evaluate_gates(W("p"), candidate, config)[0].to_dict()
    assert got == {
        "name": "traffic",
        "verdict": verdict,
        "detail": detail,
        "estimate": None,
        "interval": [None, None],
        "threshold": None,
        "needed_conversations": needed,
        "figures": {
            "conversations": candidate.conversations,
            "requests": candidate.requests,
            "min_conversations": config.min_conversations,
            "min_requests": config.min_requests,
        },
    }


@pytest.mark.parametrize(
    ("primary", "candidate", "config", "reason"),
    [
        (
            W("p", requests=100, errors=5),
            W("c", requests=40, errors=12),
            RollbackConfig(),
            "candidate error rate 30.0% over 20.0% (12/40 in 30s)",
        ),
        (
            W("p", requests=100, errors=20),
            W("c", requests=40, errors=13),
            RollbackConfig(),
            "candidate error rate 32.5% over 30.0% (13/40 in 30s)",
        ),
        (
            W("p"),
            W("c", requests=40, tool_calls=10, invalid_tool_calls=3),
            RollbackConfig(),
            "30% of the candidate's tool calls are broken (3/10: unknown tool or invalid JSON arguments)",
        ),
        (W("p"), W("c", requests=40, tool_calls=4, invalid_tool_calls=4), RollbackConfig(), None),
        (
            W("p", ttft_p95=0.1),
            W("c", requests=40, ttft_p95=0.4125),
            RollbackConfig(),
            "candidate TTFT p95 412 ms over 4 x primary 100 ms",
        ),
        (
            W("p", latency_p95=1.0),
            W("c", requests=40, latency_p95=4.5),
            RollbackConfig(),
            "candidate latency p95 4500 ms over 4 x primary 1000 ms",
        ),
        (
            W("p"),
            W("c", requests=40, ttft_p95=0.9),
            RollbackConfig(ttft_p95_ms=800),
            "candidate TTFT p95 900 ms over 800 ms",
        ),
        (W("p", ttft_p95=0.002), W("c", requests=40, ttft_p95=0.2), RollbackConfig(), None),
        (W("p"), W("c", requests=40, errors=40), RollbackConfig(enabled=False), None),
        (W("p"), W("c", requests=19, errors=19), RollbackConfig(), None),
    ],
)
def test_the_rollback_reason_names_the_rule_and_its_figures(
    primary: W, candidate: W, config: RollbackConfig, reason: str | None
) -> None:
    assert rollback_reason(primary, candidate, config) == reason


GATES: list[dict[str, Any]] = [
    {"name": "traffic", "verdict": "passed", "detail": "300 requests in 30 conversations",
     "estimate": None, "interval": [None, None], "threshold": None},
    {"name": "error_rate", "verdict": "inconclusive", "detail": "d1", "estimate": 0.0123456,
     "interval": [-0.001, None], "threshold": 0.01},
    {"name": "parity", "verdict": "failed", "detail": "d2", "estimate": 0.71,
     "interval": [0.63, 0.79], "threshold": None},
    {"name": "odd", "verdict": "weird", "detail": "d3"},
]  # fmt: skip


def test_gates_render_one_line_each_and_summarise_on_one() -> None:
    assert render_gates(GATES) == (
        "  PASS  traffic     300 requests in 30 conversations\n"
        "  WAIT  error_rate  d1\n"
        "  FAIL  parity      d2\n"
        "  ?     odd         d3"
    )
    assert gate_summary(GATES) == (
        "traffic passed, error_rate inconclusive 0.0123 [-0.001, ?] vs 0.01, "
        "parity failed 0.71 [0.63, 0.79], odd weird"
    )
