"""Every gate rule and rollback trigger at its boundary: the value exactly at a threshold,
and one step past it. A `>=` turned into `>` (or a floor dropped) fails a row here.

The promotion gates decide on intervals: an interval whose end touches the threshold has
cleared it, one that only touches it from beyond has not failed it. Constant TTFT samples
give an interval of one point, so the TTFT thresholds are tested exactly on the gate; the
error and parity gates are tested against the very bounds they report.
"""

from __future__ import annotations

import pytest

from kvmigrate.policies.gates import (
    GateConfig,
    GateResult,
    RollbackConfig,
    Verdict,
    evaluate_gates,
    rollback_reason,
)
from kvmigrate.policies.sequential import judge
from kvmigrate.policies.window import BackendWindow, ComparatorCounts

P, F, I = Verdict.PASSED, Verdict.FAILED, Verdict.INCONCLUSIVE  # noqa: E741
# A margin wide enough that a few hundred clean requests on each side pass the error gate,
# so the rows about other thresholds are not held up by it; and a minimum of 300 requests,
# enough for the order statistics to bound a p95 from above (100 cannot at this level).
WIDE = GateConfig(error_rate_margin=0.2, min_requests=300)


def window(
    requests: int = 300,
    conversations: int = 20,
    errors: int = 0,
    ttft: float | None = 0.2,
    latency: float | None = None,
    tool_calls: int = 0,
    invalid: int = 0,
    comparators: tuple[ComparatorCounts, ...] = (),
    noise_needed: int = 20,
) -> BackendWindow:
    """`ttft` / `latency`: every request's value (so the p95 and its interval are that)."""
    return BackendWindow(
        "b",
        requests=requests,
        conversations=conversations,
        errors=errors,
        ttft_p95=ttft,
        latency_p95=latency,
        tool_calls=tool_calls,
        invalid_tool_calls=invalid,
        ttft_sample=() if ttft is None else (ttft,) * requests,
        latency_sample=() if latency is None else (latency,) * requests,
        parity_samples=max((c.candidate_n for c in comparators), default=0),
        comparators=comparators,
        noise_pairs=max((c.noise_n for c in comparators), default=0),
        noise_needed=noise_needed,
    )


def gates(
    primary: BackendWindow, candidate: BackendWindow, config: GateConfig
) -> dict[str, GateResult]:
    return {g.name: g for g in evaluate_gates(primary, candidate, config)}


def verdicts(
    primary: BackendWindow, candidate: BackendWindow, config: GateConfig
) -> dict[str, str]:
    return {name: g.verdict.value for name, g in gates(primary, candidate, config).items()}


@pytest.mark.parametrize(
    ("low", "high", "threshold", "higher_is_better", "expected"),
    [
        # lower is better (error difference, TTFT ratio): the high end may touch the limit
        (0.0, 0.01, 0.01, False, P),
        (0.0, 0.0100001, 0.01, False, I),
        (0.01, 0.05, 0.01, False, I),  # touching from beyond is not yet a failure
        (0.0100001, 0.05, 0.01, False, F),
        # higher is better (parity): the low end may touch the minimum
        (0.9, 1.0, 0.9, True, P),
        (0.8999999, 1.0, 0.9, True, I),
        (0.8, 0.9, 0.9, True, I),
        (0.8, 0.8999999, 0.9, True, F),
    ],
)
def test_an_interval_touching_the_threshold_clears_it_and_does_not_fail_it(
    low: float, high: float, threshold: float, higher_is_better: bool, expected: Verdict
) -> None:
    assert judge(low, high, threshold, higher_is_better) is expected


# Traffic: min_requests (300 here) and min_conversations=20; the error and TTFT gates wait
# for min_requests too.
@pytest.mark.parametrize(
    ("requests", "conversations", "expected"),
    [
        (300, 20, {"traffic": P, "error_rate": P, "ttft_p95": P}),
        (299, 20, {"traffic": I, "error_rate": I, "ttft_p95": I}),
        (300, 19, {"traffic": I, "error_rate": P, "ttft_p95": P}),
    ],
)
def test_traffic_minimums_are_inclusive(
    requests: int, conversations: int, expected: dict[str, str]
) -> None:
    candidate = window(requests=requests, conversations=conversations)
    assert verdicts(window(), candidate, WIDE) == expected


def test_error_margin_is_held_to_the_reported_bounds_inclusively() -> None:
    primary, candidate = window(requests=4000, errors=40), window(requests=4000, errors=80)
    gate = gates(primary, candidate, GateConfig())["error_rate"]
    assert gate.estimate == pytest.approx(0.01)
    assert gate.low is not None
    assert gate.high is not None
    assert 0 < gate.low < 0.01 < gate.high
    for margin, expected in [
        (gate.high, P),  # the whole interval within the margin, its end on it
        (gate.high - 1e-6, I),
        (gate.low, I),  # the interval starts on the margin: not beyond it yet
        (gate.low - 1e-6, F),
    ]:
        got = gates(primary, candidate, GateConfig(error_rate_margin=margin))["error_rate"]
        assert got.verdict is expected, (margin, got.detail)


def test_error_limit_follows_the_primary() -> None:
    # primary 5% + 2 points: the candidate's 6% passes where an absolute 2% would fail it.
    config = GateConfig(error_rate_margin=0.02)
    primary = window(requests=20_000, errors=1000)
    assert verdicts(primary, window(requests=20_000, errors=1200), config)["error_rate"] == P
    assert verdicts(primary, window(requests=20_000, errors=1800), config)["error_rate"] == F
    alone = window(requests=0, ttft=None)
    assert verdicts(alone, window(requests=20_000, errors=1200), config)["error_rate"] == F


@pytest.mark.parametrize(
    ("candidate_s", "config", "expected"),
    [
        # The floor: against a 10 ms primary (limit 15 ms) only the floor passes 100 ms.
        (0.100, GateConfig(), P),
        (0.101, GateConfig(), F),
        (0.050, GateConfig(ttft_p95_floor_ms=40), F),
        # The SLO: 200 ms is within a 200 ms SLO, 201 ms is not (and 20x the primary).
        (0.200, GateConfig(ttft_p95_slo_ms=200), P),
        (0.201, GateConfig(ttft_p95_slo_ms=200), F),
    ],
)
def test_ttft_floor_and_slo_are_inclusive(
    candidate_s: float, config: GateConfig, expected: Verdict
) -> None:
    got = verdicts(window(ttft=0.010), window(ttft=candidate_s), config)
    assert got["ttft_p95"] == expected


@pytest.mark.parametrize(("candidate_s", "expected"), [(0.375, P), (0.376, F)])
def test_ttft_factor_at_exactly_the_limit_passes(candidate_s: float, expected: Verdict) -> None:
    # 1.5 x 250 ms = 375 ms
    got = verdicts(window(ttft=0.250), window(ttft=candidate_s), GateConfig())
    assert got["ttft_p95"] == expected


def test_ttft_factor_is_read_from_the_config() -> None:
    config = GateConfig(ttft_p95_factor=2.0)
    assert verdicts(window(ttft=0.250), window(ttft=0.500), config)["ttft_p95"] == P
    assert verdicts(window(ttft=0.250), window(ttft=0.501), config)["ttft_p95"] == F


@pytest.mark.parametrize(
    ("config", "expected"),
    [(GateConfig(ttft_p95_slo_ms=300), F), (GateConfig(), I)],
)
def test_ttft_without_a_primary_figure(config: GateConfig, expected: Verdict) -> None:
    primary = window(ttft=None)
    assert verdicts(primary, window(ttft=0.400), config)["ttft_p95"] == expected


def test_ttft_gate_falls_back_to_latency_when_nothing_streamed() -> None:
    primary = window(ttft=None, latency=0.250)
    assert verdicts(primary, window(ttft=None, latency=0.375), GateConfig())["ttft_p95"] == P
    assert verdicts(primary, window(ttft=None, latency=0.376), GateConfig())["ttft_p95"] == F
    assert verdicts(primary, window(ttft=None), GateConfig())["ttft_p95"] == I


@pytest.mark.parametrize("requests", [20, 100])
def test_a_p95_the_sample_cannot_bound_from_above_does_not_pass_the_floor(
    requests: int,
) -> None:
    # A hundred requests cannot bound a p95 at this confidence (its rank interval runs past
    # the largest value): a fast candidate waits for more rather than passing on five values.
    config = GateConfig(min_requests=20)
    candidate = window(requests=requests, ttft=0.050)
    gate = gates(window(ttft=0.010), candidate, config)["ttft_p95"]
    assert gate.verdict is I
    assert gate.high is None  # unbounded, reported as such
    assert gate.needed_conversations is not None


def text(n: int, disagree: int, noise_n: int = 200, noise_disagree: int = 0) -> ComparatorCounts:
    return ComparatorCounts("text", n, disagree, noise_n, noise_disagree)


def test_parity_minimum_is_held_to_the_reported_low_end_inclusively() -> None:
    candidate = window(comparators=(text(400, 20, 400, 4),))
    gate = gates(window(), candidate, GateConfig(min_parity=0.9))["parity"]
    assert gate.verdict is P
    assert gate.low is not None
    assert gate.high is not None
    assert gate.estimate == pytest.approx(1 - (20 - 4) / 400)
    for minimum, expected in [
        (gate.low, P),
        (gate.low + 1e-6, I),
        (gate.high, I),
        (gate.high + 1e-6, F),
    ]:
        got = gates(window(), candidate, GateConfig(min_parity=minimum))["parity"]
        assert got.verdict is expected, (minimum, got.detail)


@pytest.mark.parametrize(("pairs", "covered"), [(30, True), (29, False)])
def test_a_comparator_counts_from_exactly_min_parity_samples(pairs: int, covered: bool) -> None:
    # 30 of 30 disagreeing against a clean noise floor fails, once it counts at all.
    candidate = window(comparators=(text(pairs, pairs),))
    gate = gates(window(), candidate, GateConfig(min_parity=0.9))["parity"]
    assert gate.verdict is (F if covered else I)
    assert ("text" in gate.figures["not_yet_covered"]) is not covered


@pytest.mark.parametrize(("noise", "covered"), [(20, True), (19, False)])
def test_a_comparator_counts_from_exactly_the_noise_pairs_needed(noise: int, covered: bool) -> None:
    candidate = window(comparators=(text(200, 200, noise_n=noise),))
    gate = gates(window(), candidate, GateConfig(min_parity=0.9))["parity"]
    assert gate.verdict is (F if covered else I)


def test_a_comparator_not_yet_covered_never_sets_the_headline() -> None:
    # The case: 13 topic pairs that disagree would have set a headline of 0.81.
    topic = ComparatorCounts("topic", 13, 3, 200, 0)
    candidate = window(comparators=(text(600, 2, 600, 2), topic))
    gate = gates(window(), candidate, GateConfig(min_parity=0.9))["parity"]
    assert gate.verdict is P
    assert gate.estimate == 1.0
    assert "not yet covered: topic (13/30 pairs" in gate.detail
    assert gate.figures["not_yet_covered"] == ["topic"]


def test_parity_gate_is_off_without_a_minimum() -> None:
    candidate = window(comparators=(text(99, 90),))
    assert "parity" not in verdicts(window(), candidate, GateConfig())


# Rollback defaults: min_requests=20, max_error_rate=0.2, error_rate_margin=0.1,
# ttft_p95_factor=4, ttft_floor_ms=250, max_invalid_tool_call_rate=0.2, min_tool_calls=5.
CALM = window(requests=20, errors=0, ttft=0.1)


@pytest.mark.parametrize(
    ("primary", "candidate", "config", "trigger"),
    [
        # the request minimum, inclusive
        (CALM, window(requests=19, errors=19), RollbackConfig(), False),
        (CALM, window(requests=20, errors=20), RollbackConfig(), True),
        (CALM, window(requests=20, errors=20), RollbackConfig(enabled=False), False),
        # the absolute error rate: 4/20 = 20% is on it, 5/20 over it
        (CALM, window(requests=20, errors=4), RollbackConfig(), False),
        (CALM, window(requests=20, errors=5), RollbackConfig(), True),
        # or the primary's rate + margin when higher: 15% + 10% = 25%
        (window(requests=20, errors=3), window(requests=20, errors=5), RollbackConfig(), False),
        (window(requests=20, errors=3), window(requests=20, errors=6), RollbackConfig(), True),
        # broken tool calls: 5 calls needed, 1/5 = 20% is on the limit, 2/5 over it
        (CALM, window(requests=20, tool_calls=4, invalid=4), RollbackConfig(), False),
        (CALM, window(requests=20, tool_calls=5, invalid=1), RollbackConfig(), False),
        (CALM, window(requests=20, tool_calls=5, invalid=2), RollbackConfig(), True),
        # the TTFT factor: 4 x 100 ms = 400 ms is on it
        (CALM, window(requests=20, ttft=0.400), RollbackConfig(), False),
        (CALM, window(requests=20, ttft=0.401), RollbackConfig(), True),
        # the floor: 250 ms is 10x a 25 ms primary and still no trigger; 251 ms is
        (window(requests=20, ttft=0.025), window(requests=20, ttft=0.250), RollbackConfig(), False),
        (window(requests=20, ttft=0.025), window(requests=20, ttft=0.251), RollbackConfig(), True),
        # the absolute TTFT limit, with no primary figure to compare with
        (window(ttft=None), window(requests=20, ttft=0.5), RollbackConfig(ttft_p95_ms=500), False),
        (window(ttft=None), window(requests=20, ttft=0.501), RollbackConfig(ttft_p95_ms=500), True),
        (window(ttft=None), window(requests=20, ttft=9.0), RollbackConfig(), False),
        # nothing streamed: total latency is judged the same way
        (
            window(ttft=None, latency=0.1),
            window(requests=20, ttft=None, latency=0.401),
            RollbackConfig(),
            True,
        ),
        (
            window(ttft=None, latency=0.1),
            window(requests=20, ttft=None, latency=0.400),
            RollbackConfig(),
            False,
        ),
        (CALM, window(requests=20, ttft=None, latency=None), RollbackConfig(), False),
    ],
)
def test_rollback_trigger_boundaries(
    primary: BackendWindow, candidate: BackendWindow, config: RollbackConfig, trigger: bool
) -> None:
    assert (rollback_reason(primary, candidate, config) is not None) is trigger


@pytest.mark.parametrize(
    ("errors", "requests", "rate"),
    [(0, 0, 0.0), (3, 0, 0.0), (0, 4, 0.0), (1, 4, 0.25), (4, 4, 1.0), (3, 1, 3.0)],
)
def test_a_window_error_rate_is_errors_per_request_and_zero_without_requests(
    errors: int, requests: int, rate: float
) -> None:
    assert BackendWindow("b", requests=requests, errors=errors).error_rate == rate


@pytest.mark.parametrize(
    ("candidate_s", "floor_ms", "expected"),
    [(0.100, 100, P), (0.101, 100, I), (0.050, 50, P), (0.050, 40, I)],
)
def test_without_a_primary_figure_the_floor_alone_passes_the_ttft_gate(
    candidate_s: float, floor_ms: int, expected: Verdict
) -> None:
    # No primary TTFT and no SLO: nothing to divide by, so only a p95 surely under the floor
    # decides (inclusively); above it the gate waits for a primary figure or an SLO.
    config = GateConfig(ttft_p95_floor_ms=floor_ms)
    got = verdicts(window(ttft=None), window(ttft=candidate_s), config)
    assert got["ttft_p95"] == expected


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (GateConfig(), I),  # the interval starts exactly at the 100 ms floor
        (GateConfig(ttft_p95_floor_ms=99), F),
        (GateConfig(ttft_p95_slo_ms=100, ttft_p95_floor_ms=50), I),  # exactly at the SLO
        (GateConfig(ttft_p95_slo_ms=99, ttft_p95_floor_ms=50), F),
    ],
)
def test_only_a_p95_surely_above_the_floor_and_the_slo_can_fail(
    config: GateConfig, expected: Verdict
) -> None:
    # 50x the primary, but its p95 interval is [100 ms, 500 ms]: under a limit it would pass,
    # so a low end that only touches the limit leaves the gate waiting.
    candidate = BackendWindow(
        "c", requests=300, conversations=40, ttft_sample=(0.1,) * 280 + (0.5,) * 20
    )
    primary = BackendWindow("p", requests=300, ttft_sample=(0.01,) * 300)
    assert gates(primary, candidate, config)["ttft_p95"].verdict == expected
