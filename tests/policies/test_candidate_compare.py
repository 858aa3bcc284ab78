"""Candidates against each other (`policies.candidate_compare`): which of two candidates of a
cohort leads on error rate, TTFT p50 and parity, and only when the interval says so."""

from __future__ import annotations

import pytest

from kvmigrate.policies.candidate_compare import (
    Lead,
    PairDifference,
    compare_candidates,
    error_rate_difference,
    lead,
    parity_difference,
    ttft_p50_difference,
)
from kvmigrate.policies.gate_model import GateConfig
from kvmigrate.policies.window import BackendWindow, ComparatorCounts

CONFIG = GateConfig(min_conversations=20, min_requests=100, min_parity_samples=30)


def window(
    backend: str,
    requests: int = 4000,
    errors: int = 0,
    ttft_ms: tuple[float, ...] = (),
    disagree: tuple[int, int] | None = None,
) -> BackendWindow:
    """`ttft_ms`: values repeated to fill `requests`; `disagree`: (pairs, disagreements)."""
    sample = tuple(ttft_ms[i % len(ttft_ms)] / 1000 for i in range(requests)) if ttft_ms else ()
    comparators = (
        (ComparatorCounts("tool_calls", disagree[0], disagree[1], 400, 4),) if disagree else ()
    )
    return BackendWindow(
        backend, requests=requests, conversations=requests // 10, errors=errors,
        ttft_sample=sample, comparators=comparators,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("low", "high", "lower_is_better", "expected"),
    [
        (-0.02, -0.01, True, Lead.A),
        (-0.02, -0.01, False, Lead.B),
        (0.01, 0.02, True, Lead.B),
        (0.01, 0.02, False, Lead.A),
        (-0.01, 0.01, True, Lead.UNDECIDED),
        (0.0, 0.02, True, Lead.UNDECIDED),  # touching zero: a tie is possible
        (-0.02, 0.0, False, Lead.UNDECIDED),
        (0.0, 0.0, True, Lead.UNDECIDED),
    ],
)
def test_a_lead_needs_an_interval_wholly_on_one_side_of_zero(
    low: float, high: float, lower_is_better: bool, expected: Lead
) -> None:
    assert lead(low, high, lower_is_better) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected", "leader"),
    [
        (window("bf16", errors=400), window("fp8", errors=40), Lead.B, "fp8"),  # 10% vs 1%
        (window("bf16", errors=40), window("fp8", errors=400), Lead.A, "bf16"),
        (window("bf16", errors=40), window("fp8", errors=44), Lead.UNDECIDED, None),
        (window("bf16", errors=0), window("fp8", errors=0), Lead.UNDECIDED, None),
        (window("bf16", 99, errors=99), window("fp8", errors=0), Lead.UNDECIDED, None),
    ],
    ids=["b-better", "a-better", "close", "both-clean", "too-few"],
)
def test_error_rate(a: BackendWindow, b: BackendWindow, expected: Lead, leader: str) -> None:
    got = error_rate_difference(a, b, CONFIG)
    assert (got.lead, got.leader, got.measure) == (expected, leader, "error_rate")
    if got.estimate is not None:
        assert got.low is not None
        assert got.high is not None
        assert got.low <= got.estimate <= got.high
        assert got.estimate == pytest.approx(a.error_rate - b.error_rate)


def test_an_error_rate_too_thin_to_compare_says_what_it_lacks() -> None:
    got = error_rate_difference(window("bf16", 99), window("fp8", 40), CONFIG)
    assert got.estimate is None
    assert got.low is None
    assert "need 100 requests of each" in got.detail
    assert "have 99 and 40" in got.detail


def test_a_close_difference_says_how_much_more_traffic_would_decide_it() -> None:
    got = error_rate_difference(window("bf16", errors=40), window("fp8", errors=60), CONFIG)
    assert got.lead is Lead.UNDECIDED
    assert got.needed_conversations is not None
    assert got.needed_conversations > 0
    assert f"about {got.needed_conversations} more conversations each" in got.detail
    tie = error_rate_difference(window("bf16", errors=40), window("fp8", errors=40), CONFIG)
    assert tie.needed_conversations is None
    assert "too close to call to say how much more traffic it needs" in tie.detail


@pytest.mark.parametrize(
    ("a_ms", "b_ms", "expected"),
    [
        ((80, 90, 100, 110, 120), (40, 45, 50, 55, 60), Lead.B),
        ((40, 45, 50, 55, 60), (80, 90, 100, 110, 120), Lead.A),
        ((80, 90, 100, 110, 120), (81, 90, 100, 110, 119), Lead.UNDECIDED),
        ((50,), (50,), Lead.UNDECIDED),  # identical constant samples: a tie, never a lead
    ],
    ids=["b-faster", "a-faster", "same", "constant"],
)
def test_ttft_p50(a_ms: tuple[float, ...], b_ms: tuple[float, ...], expected: Lead) -> None:
    got = ttft_p50_difference(window("bf16", ttft_ms=a_ms), window("fp8", ttft_ms=b_ms), CONFIG)
    assert (got.lead, got.measure) == (expected, "ttft_p50")
    assert got.estimate is not None
    assert got.low is not None
    assert got.high is not None
    assert got.low <= got.estimate <= got.high
    assert "TTFT p50" in got.detail


def test_ttft_without_streamed_answers_compares_latency_and_waits_without_any() -> None:
    a = BackendWindow("bf16", requests=200, latency_sample=(0.2,) * 200)
    b = BackendWindow("fp8", requests=200, latency_sample=(0.1,) * 200)
    got = ttft_p50_difference(a, b, CONFIG)
    assert (got.lead, got.leader) == (Lead.B, "fp8")
    assert "latency p50" in got.detail
    empty = ttft_p50_difference(BackendWindow("bf16", 200), BackendWindow("fp8", 200), CONFIG)
    assert empty.lead is Lead.UNDECIDED
    assert empty.estimate is None


@pytest.mark.parametrize(
    ("a_pairs", "b_pairs", "expected"),
    [
        ((400, 8), (400, 80), Lead.A),  # A disagrees with the primary 2%, B 20%
        ((400, 80), (400, 8), Lead.B),
        ((400, 8), (400, 10), Lead.UNDECIDED),
        ((29, 0), (400, 80), Lead.UNDECIDED),  # A has too few scored pairs
    ],
    ids=["a-closer", "b-closer", "close", "too-few"],
)
def test_parity(a_pairs: tuple[int, int], b_pairs: tuple[int, int], expected: Lead) -> None:
    got = parity_difference(
        window("bf16", disagree=a_pairs), window("fp8", disagree=b_pairs), CONFIG
    )
    assert (got.lead, got.measure) == (expected, "parity")
    if got.estimate is not None:
        parity_a = 1 - a_pairs[1] / a_pairs[0]
        parity_b = 1 - b_pairs[1] / b_pairs[0]
        assert got.estimate == pytest.approx(parity_a - parity_b)


def test_parity_counts_only_comparators_both_were_scored_on() -> None:
    a = BackendWindow(
        "bf16",
        comparators=(
            ComparatorCounts("tool_calls", 400, 8, 400, 4),
            ComparatorCounts("json_valid", 400, 200, 400, 4),
        ),
    )
    b = BackendWindow("fp8", comparators=(ComparatorCounts("tool_calls", 400, 80, 400, 4),))
    got = parity_difference(a, b, CONFIG)
    # json_valid (where A disagrees half the time) is A's alone: it does not count.
    assert got.lead is Lead.A
    assert got.estimate == pytest.approx(0.98 - 0.80)


def test_every_pair_on_every_measure_in_order() -> None:
    windows = [window("bf16"), window("fp8"), window("awq")]
    got: list[PairDifference] = compare_candidates(windows, CONFIG)
    assert [(d.a, d.b, d.measure) for d in got] == [
        (a, b, m)
        for a, b in (("bf16", "fp8"), ("bf16", "awq"), ("fp8", "awq"))
        for m in ("error_rate", "ttft_p50", "parity")
    ]
    assert compare_candidates(windows[:1], CONFIG) == []
