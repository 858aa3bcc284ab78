"""What each gate reports, exactly: the detail line an operator reads, the figures and the
interval that `kvmigrate rollout status` and the report print. Rows computed once and
checked by hand against the counts (the rates, their rounding, the signed points); the
intervals are the sequential Wilson / Newcombe ones (tests/test_sequential.py)."""

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
from kvmigrate.policies.gates import GateConfig, Verdict
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
        "candidate 100.00% - primary 0.00% = +100.00 pts [+9.79 pts, +100.00 pts] vs margin +99.90 pts (rollout.gates.error_rate_margin); the estimate sits on the threshold: more traffic alone will not decide it",
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
        "candidate 100.00% - primary 0.00% = +100.00 pts [-27.57 pts, +100.00 pts] vs margin +99.90 pts (rollout.gates.error_rate_margin); the estimate sits on the threshold: more traffic alone will not decide it",
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
        (None, 100, "; the estimate sits on the threshold: more traffic alone will not decide it"),
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
