"""Gates and the auto-rollback trigger are pure functions: tested as tables."""

from __future__ import annotations

import pytest

from kvmigrate.policies.gates import (
    GateConfig,
    GateResult,
    RollbackConfig,
    Verdict,
    all_passed,
    evaluate_gates,
    gate_summary,
    rollback_reason,
)
from kvmigrate.policies.window import BackendWindow, ComparatorCounts

P = "passed"
F = "failed"
I = "inconclusive"  # noqa: E741


def w(
    name: str,
    requests: int = 4000,
    conversations: int = 40,
    errors: int = 0,
    p95: float | None = 0.5,
    comparators: tuple[ComparatorCounts, ...] = (),
) -> BackendWindow:
    """`p95`: every request's TTFT, so the p95 and its interval are exactly that."""
    return BackendWindow(
        name,
        requests,
        conversations,
        errors,
        p95 and p95 / 2,
        p95,
        ttft_sample=() if p95 is None else (p95,) * requests,
        parity_samples=max((c.candidate_n for c in comparators), default=0),
        comparators=comparators,
        noise_pairs=max((c.noise_n for c in comparators), default=0),
        noise_needed=20,
    )


PRIMARY = w("hosted", errors=40, p95=0.5)  # 1% errors
GOOD_TEXT = ComparatorCounts("text", 500, 10, 500, 10)  # no more disagreement than noise
BAD_TEXT = ComparatorCounts("text", 500, 110, 500, 10)  # 20 points more


@pytest.mark.parametrize(
    ("candidate", "config", "expected"),
    [
        (w("vllm", p95=0.1), GateConfig(), {"traffic": P, "error_rate": P, "ttft_p95": P}),
        (
            w("vllm", requests=50, conversations=5),
            GateConfig(),
            {"traffic": I, "error_rate": I, "ttft_p95": I},
        ),
        (w("vllm", conversations=5), GateConfig(), {"traffic": I, "error_rate": P, "ttft_p95": P}),
        # 1% primary, margin 1 point: as many errors passes, 5% fails, 1.75% is not yet clear
        (w("vllm", errors=40), GateConfig(), {"traffic": P, "error_rate": P, "ttft_p95": P}),
        (w("vllm", errors=200), GateConfig(), {"traffic": P, "error_rate": F, "ttft_p95": P}),
        (w("vllm", errors=70), GateConfig(), {"traffic": P, "error_rate": I, "ttft_p95": P}),
        # 1.5 x 500 ms = 750 ms
        (w("vllm", p95=0.74), GateConfig(), {"traffic": P, "error_rate": P, "ttft_p95": P}),
        (w("vllm", p95=0.80), GateConfig(), {"traffic": P, "error_rate": P, "ttft_p95": F}),
        # an SLO passes a candidate slower than the factor allows
        (
            w("vllm", p95=0.80),
            GateConfig(ttft_p95_slo_ms=900),
            {"traffic": P, "error_rate": P, "ttft_p95": P},
        ),
        (w("vllm", p95=None), GateConfig(), {"traffic": P, "error_rate": P, "ttft_p95": I}),
        (
            w("vllm", comparators=(GOOD_TEXT,)),
            GateConfig(min_parity=0.9),
            {"traffic": P, "error_rate": P, "ttft_p95": P, "parity": P},
        ),
        (
            w("vllm", comparators=(BAD_TEXT,)),
            GateConfig(min_parity=0.9),
            {"traffic": P, "error_rate": P, "ttft_p95": P, "parity": F},
        ),
        (
            w("vllm", comparators=(ComparatorCounts("text", 3, 0, 500, 10),)),
            GateConfig(min_parity=0.9),
            {"traffic": P, "error_rate": P, "ttft_p95": P, "parity": I},
        ),
    ],
)
def test_gate_table(candidate: BackendWindow, config: GateConfig, expected: dict[str, str]) -> None:
    results = evaluate_gates(PRIMARY, candidate, config)
    assert {r.name: r.verdict.value for r in results} == expected
    assert all_passed(results) == all(v == P for v in expected.values())
    for result in results:
        assert result.detail
        assert result.figures
        assert result.to_dict()["verdict"] in {v.value for v in Verdict}


def test_an_undecided_gate_says_how_many_conversations_it_still_needs() -> None:
    # 1.75% against 1% with a 1-point margin: the interval straddles the margin today; at
    # the same rates, the count it names is enough to decide, and a little less is not.
    candidate = w("vllm", errors=70)
    [gate] = [g for g in evaluate_gates(PRIMARY, candidate, GateConfig()) if g.name == "error_rate"]
    assert gate.verdict is Verdict.INCONCLUSIVE
    assert gate.needed_conversations is not None
    assert gate.needed_conversations > 0
    assert f"about {gate.needed_conversations} more conversations" in gate.detail
    assert gate.low is not None
    assert gate.high is not None
    assert gate.low < 0.01 < gate.high
    scale = (40 + gate.needed_conversations) / 40
    bigger = w("vllm", requests=round(4000 * scale), errors=round(70 * scale))
    primary = w("hosted", requests=round(4000 * scale), errors=round(40 * scale))
    later = [g for g in evaluate_gates(primary, bigger, GateConfig()) if g.name == "error_rate"]
    assert later[0].verdict is not Verdict.INCONCLUSIVE


@pytest.mark.parametrize(
    ("candidate", "config", "trigger"),
    [
        (w("vllm", requests=100, errors=10), RollbackConfig(), None),  # 10% < 20%
        (w("vllm", requests=100, errors=25), RollbackConfig(), "error rate"),
        (w("vllm", requests=10, errors=10), RollbackConfig(), None),  # too few to judge
        (w("vllm", requests=100, errors=25), RollbackConfig(enabled=False), None),
        (w("vllm", p95=2.5), RollbackConfig(), "TTFT"),  # 5 x primary's 0.5 s
        (w("vllm", p95=1.5), RollbackConfig(), None),
        (w("vllm", p95=1.5), RollbackConfig(ttft_p95_ms=1000), "TTFT"),
    ],
)
def test_rollback_trigger_table(
    candidate: BackendWindow, config: RollbackConfig, trigger: str | None
) -> None:
    reason = rollback_reason(PRIMARY, candidate, config)
    if trigger is None:
        assert reason is None
    else:
        assert reason is not None
        assert trigger in reason


def test_rollback_tolerates_a_primary_that_fails_as_much() -> None:
    bad_primary = w("hosted", requests=100, errors=30)
    candidate = w("vllm", requests=100, errors=35)
    assert rollback_reason(bad_primary, candidate, RollbackConfig()) is None


@pytest.mark.parametrize(
    ("calls", "invalid", "trigger"),
    [(20, 2, False), (20, 10, True), (3, 3, False)],  # 10% ok, 50% not, too few to judge
)
def test_broken_tool_calls_trigger_rollback(calls: int, invalid: int, trigger: bool) -> None:
    candidate = BackendWindow(
        "vllm", requests=100, conversations=20, tool_calls=calls, invalid_tool_calls=invalid
    )
    reason = rollback_reason(PRIMARY, candidate, RollbackConfig())
    assert (reason is not None) == trigger
    if trigger:
        assert reason is not None
        assert "tool calls are broken" in reason


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (
            {
                "choices": [
                    {
                        "message": {
                            "tool_calls": [
                                {"function": {"name": "search", "arguments": '{"q": "x"}'}}
                            ]
                        }
                    }
                ]
            },
            (1, 0),
        ),
        (
            {
                "choices": [
                    {
                        "message": {
                            "tool_calls": [
                                {"function": {"name": "search_call", "arguments": '{"q": "x"}'}}
                            ]
                        }
                    }
                ]
            },
            (1, 1),
        ),
        (
            {
                "choices": [
                    {
                        "message": {
                            "tool_calls": [
                                {"function": {"name": "search", "arguments": '{"q": "x'}}
                            ]
                        }
                    }
                ]
            },
            (1, 1),
        ),
        (
            {
                "choices": [
                    {
                        "message": {
                            "tool_calls": [{"function": {"name": "search", "arguments": "[1]"}}]
                        }
                    }
                ]
            },
            (1, 1),
        ),
        ({"choices": [{"message": {"content": "hi"}}]}, (0, 0)),
    ],
)
def test_invalid_tool_call_table(response: dict[str, object], expected: tuple[int, int]) -> None:
    from kvmigrate.policies.tool_calls import invalid_tool_calls

    request = {"tools": [{"type": "function", "function": {"name": "search"}}]}
    assert invalid_tool_calls(request, response) == expected


@pytest.mark.parametrize(
    ("candidate", "primary", "trigger"),
    [
        # 4x of a millisecond is scheduling noise, not a blow-up: under the 250 ms floor
        (
            BackendWindow("vllm", 100, ttft_p95=0.02),
            BackendWindow("hosted", 100, ttft_p95=0.002),
            False,
        ),
        (
            BackendWindow("vllm", 100, ttft_p95=1.2),
            BackendWindow("hosted", 100, ttft_p95=0.2),
            True,
        ),
        # nothing streamed: total latency is judged instead
        (
            BackendWindow("vllm", 100, latency_p95=3.0),
            BackendWindow("hosted", 100, latency_p95=0.5),
            True,
        ),
        (
            BackendWindow("vllm", 100, latency_p95=0.6),
            BackendWindow("hosted", 100, latency_p95=0.5),
            False,
        ),
    ],
)
def test_rollback_ttft_floor_and_latency_fallback(
    candidate: BackendWindow, primary: BackendWindow, trigger: bool
) -> None:
    assert (rollback_reason(primary, candidate, RollbackConfig()) is not None) == trigger


def test_ttft_gate_uses_latency_when_nothing_streamed() -> None:
    candidate = BackendWindow("vllm", 400, 40, latency_p95=0.4, latency_sample=(0.4,) * 400)
    primary = BackendWindow("hosted", 400, 40, latency_p95=0.9, latency_sample=(0.9,) * 400)
    gate = evaluate_gates(primary, candidate, GateConfig())[2]
    assert gate.verdict is Verdict.PASSED
    assert "latency p95 (nothing streamed)" in gate.detail


def _detail(candidate: BackendWindow, name: str, config: GateConfig | None = None) -> str:
    config = config or GateConfig(min_parity=0.9)
    [gate] = [g for g in evaluate_gates(PRIMARY, candidate, config) if g.name == name]
    assert gate.verdict is Verdict.INCONCLUSIVE
    return gate.detail


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("traffic", ["100", "20", "have 57 in 6", "rollout.gates.min_requests",
                     "rollout.gates.min_conversations"]),
        ("error_rate", ["need 100", "have 57", "rollout.gates.min_requests"]),
        ("ttft_p95", ["need 100", "have 57", "rollout.gates.min_requests"]),
        ("parity", ["need 30 scored pairs", "have 12", "rollout.gates.min_parity_samples"]),
    ],
)  # fmt: skip
def test_every_wait_names_the_threshold_the_count_and_the_config_key(
    name: str, words: list[str]
) -> None:
    candidate = BackendWindow(
        "vllm", requests=57, conversations=6, ttft_p95=0.1, parity=0.95, parity_samples=12,
        ttft_sample=(0.1,) * 57,
    )  # fmt: skip
    detail = _detail(candidate, name)
    for word in words:
        assert word in detail, detail


def test_parity_wait_names_the_missing_noise_pairs_and_how_long_they_take() -> None:
    # Enough scored pairs, but the primary-vs-primary noise floor is not known yet: the
    # gate must say so, not "need 30 scored pairs; have 81".
    candidate = BackendWindow(
        "vllm", 200, 40, ttft_p95=0.1, parity=None, parity_samples=81,
        noise_pairs=3, noise_needed=20, span_s=600.0,
    )  # fmt: skip
    detail = _detail(candidate, "parity")
    assert "scored pairs;" not in detail
    assert "need 30" not in detail
    for word in ("81 scored pairs", "20 primary-vs-primary", "have 3", "rollout.noise_sample"):
        assert word in detail, detail
    assert "about 57 min more" in detail  # 17 more pairs at 3 per 10 minutes


def test_a_wait_says_how_long_at_the_current_rate() -> None:
    candidate = BackendWindow("vllm", requests=50, conversations=25, span_s=300.0)
    assert "about 5 min more" in _detail(candidate, "error_rate")
    assert "about 5 min more" in _detail(candidate, "traffic")
    assert "none in the last" in _detail(BackendWindow("vllm", span_s=300.0), "traffic")


def test_the_one_line_summary_carries_each_estimate_and_interval() -> None:
    results = evaluate_gates(PRIMARY, w("vllm", errors=40), GateConfig())
    summary = gate_summary([g.to_dict() for g in results])
    [error] = [g for g in results if g.name == "error_rate"]
    assert error.low is not None
    assert error.high is not None
    assert f"error_rate passed 0 [{error.low:.3g}, {error.high:.3g}] vs 0.01" in summary
    assert "traffic passed" in summary  # no estimate: the verdict alone


def test_a_gate_result_with_its_interval_survives_the_admin_apis_encoding() -> None:
    # The admin API sends GateResults as msgspec JSON; an unbounded end travels as null.
    import msgspec

    fast = BackendWindow("vllm", 20, 20, ttft_p95=0.05, ttft_sample=(0.05,) * 20)
    results = evaluate_gates(PRIMARY, fast, GateConfig(min_requests=20, min_conversations=2))
    results += evaluate_gates(PRIMARY, w("vllm", errors=70), GateConfig())
    for result in results:
        decoded = msgspec.json.decode(msgspec.json.encode(result), type=GateResult)
        assert decoded == result
    [ttft] = [r for r in results[:3] if r.name == "ttft_p95"]
    assert ttft.high is None  # twenty values cannot bound a p95 from above
