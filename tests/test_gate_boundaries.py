"""Every gate rule and rollback trigger at its boundary: the value exactly at a threshold,
and one step past it. A `>=` turned into `>` (or a floor dropped) fails a row here."""

from __future__ import annotations

import pytest

from kvmigrate.policies.gates import (
    GateConfig,
    RollbackConfig,
    Verdict,
    evaluate_gates,
    rollback_reason,
)
from kvmigrate.policies.window import BackendWindow

P, F, I = Verdict.PASSED, Verdict.FAILED, Verdict.INCONCLUSIVE  # noqa: E741


def window(
    requests: int = 100,
    conversations: int = 20,
    errors: int = 0,
    ttft: float | None = 0.2,
    latency: float | None = None,
    parity: float | None = None,
    samples: int = 0,
    tool_calls: int = 0,
    invalid: int = 0,
) -> BackendWindow:
    return BackendWindow(
        "b",
        requests=requests,
        conversations=conversations,
        errors=errors,
        ttft_p95=ttft,
        latency_p95=latency,
        parity=parity,
        parity_samples=samples,
        tool_calls=tool_calls,
        invalid_tool_calls=invalid,
    )


def verdicts(
    primary: BackendWindow, candidate: BackendWindow, config: GateConfig
) -> dict[str, str]:
    return {g.name: g.verdict.value for g in evaluate_gates(primary, candidate, config)}


# Traffic: min_requests=100 and min_conversations=20 by default; the error and TTFT gates
# wait for min_requests too.
@pytest.mark.parametrize(
    ("requests", "conversations", "expected"),
    [
        (100, 20, {"traffic": P, "error_rate": P, "ttft_p95": P}),
        (99, 20, {"traffic": I, "error_rate": I, "ttft_p95": I}),
        (100, 19, {"traffic": I, "error_rate": P, "ttft_p95": P}),
    ],
)
def test_traffic_minimums_are_inclusive(
    requests: int, conversations: int, expected: dict[str, str]
) -> None:
    candidate = window(requests=requests, conversations=conversations)
    assert verdicts(window(), candidate, GateConfig()) == expected


@pytest.mark.parametrize(("errors", "expected"), [(1, P), (2, F)])
def test_error_rate_at_exactly_the_limit_passes(errors: int, expected: Verdict) -> None:
    # primary 0% + margin 1% = 1%: 1/100 sits on the limit, 2/100 is over it.
    primary = window(errors=0)
    candidate = window(errors=errors)
    assert verdicts(primary, candidate, GateConfig())["error_rate"] == expected


def test_error_limit_follows_the_primary() -> None:
    # primary 5% + 1%: the candidate's 6% passes where an absolute 1% would fail it.
    assert verdicts(window(errors=5), window(errors=6), GateConfig())["error_rate"] == P
    assert verdicts(window(errors=5), window(errors=7), GateConfig())["error_rate"] == F


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


@pytest.mark.parametrize(
    ("parity", "samples", "expected"),
    [
        (0.9, 30, P),  # exactly min_parity, exactly min_parity_samples
        (0.8999, 30, F),
        (0.99, 29, I),
        (None, 30, I),
    ],
)
def test_parity_gate_boundaries(parity: float | None, samples: int, expected: Verdict) -> None:
    candidate = window(parity=parity, samples=samples)
    got = verdicts(window(), candidate, GateConfig(min_parity=0.9))
    assert got["parity"] == expected


def test_parity_gate_is_off_without_a_minimum() -> None:
    assert "parity" not in verdicts(window(), window(parity=0.1, samples=99), GateConfig())


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
