"""Promotion gates and the auto-rollback trigger: pure functions over windows of traffic.

Each gate answers with an estimate, its always-valid confidence interval and a verdict:
Passed when the interval clears the threshold, Failed when it lies beyond it, Inconclusive
otherwise, with the conversations still needed at the observed rates. So a refused
promotion explains itself, and repeated looks during a bake do not inflate false alarms
(`policies.sequential`). A promotion needs every gate Passed; `--force` overrides, and the
override is recorded. The auto-rollback trigger stays a fast point-estimate rule over a
short window: it exists to pull a plainly broken candidate out within seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmigrate.policies.decode_gate import NAME as DECODE_GATE
from kvmigrate.policies.decode_gate import decode_gate
from kvmigrate.policies.error_gate import error_gate
from kvmigrate.policies.gate_model import GateConfig, GateResult, eta
from kvmigrate.policies.parity_gate import parity_gate
from kvmigrate.policies.sequential import Verdict
from kvmigrate.policies.ttft_gate import ttft_gate
from kvmigrate.policies.window import BackendWindow

__all__ = [
    "GateConfig",
    "GateResult",
    "RollbackConfig",
    "Verdict",
    "all_passed",
    "evaluate_gates",
    "gate_summary",
    "gates_left_off",
    "gates_off",
    "render_gates",
    "rollback_reason",
]


def evaluate_gates(
    primary: BackendWindow, candidate: BackendWindow, config: GateConfig
) -> list[GateResult]:
    results = [
        _traffic_gate(candidate, config),
        error_gate(primary, candidate, config),
        ttft_gate(primary, candidate, config),
    ]
    if config.min_parity is not None:
        results.append(parity_gate(candidate, config))
    if config.tps_p50_min is not None:
        results.append(decode_gate(candidate, config))
    return results


# The gates a config may leave off, each with the key that turns it on. A gate that is off
# promotes nothing by passing: `rollout status` lists it as off, so that a missing gate is
# seen rather than assumed (a candidate parity failed at 0.435 was promoted to 100% with
# `min_parity` commented out and no line saying so).
OPTIONAL_GATES = {"parity": "min_parity", DECODE_GATE: "tps_p50_min"}


def gates_left_off(config: GateConfig) -> dict[str, str]:
    """The optional gates `config` leaves off, each with the key that turns it on."""
    return {name: key for name, key in OPTIONAL_GATES.items() if getattr(config, key) is None}


def gates_off(gates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The optional gates missing from `gates` (`GateResult.to_dict()` shape), as lines
    `render_gates` prints with the verdict "off"."""
    present = {g["name"] for g in gates}
    return [
        {"name": name, "verdict": "off", "detail": f"off (rollout.gates.{key} not set)"}
        for name, key in OPTIONAL_GATES.items()
        if name not in present
    ]


def render_gates(gates: list[dict[str, Any]]) -> str:
    """One line per gate (`GateResult.to_dict()` shape), as the CLI and the demo print them:
    the verdict, and the estimate with its interval against the threshold in the detail."""
    marks = {"passed": "PASS", "failed": "FAIL", "inconclusive": "WAIT", "off": "OFF"}
    return "\n".join(
        f"  {marks.get(g['verdict'], '?'):4}  {g['name']:<11} {g['detail']}" for g in gates
    )


def gate_summary(gates: list[dict[str, Any]]) -> str:
    """The gates (`GateResult.to_dict()` shape) on one line, each with its estimate and
    interval against its threshold where it has them: for history and the report."""
    return ", ".join(_summary(g) for g in gates)


def _summary(gate: dict[str, Any]) -> str:
    text = f"{gate['name']} {gate['verdict']}"
    estimate, (low, high) = gate.get("estimate"), gate.get("interval") or (None, None)
    if estimate is None:
        return text
    ends = ", ".join("?" if v is None else f"{v:.3g}" for v in (low, high))
    threshold = gate.get("threshold")
    return text + f" {estimate:.3g} [{ends}]" + ("" if threshold is None else f" vs {threshold:g}")


def all_passed(results: list[GateResult]) -> bool:
    return all(r.verdict is Verdict.PASSED for r in results)


def _traffic_gate(candidate: BackendWindow, config: GateConfig) -> GateResult:
    figures = {
        "conversations": candidate.conversations,
        "requests": candidate.requests,
        "min_conversations": config.min_conversations,
        "min_requests": config.min_requests,
    }
    if (
        candidate.conversations >= config.min_conversations
        and candidate.requests >= config.min_requests
    ):
        return GateResult(
            "traffic",
            Verdict.PASSED,
            f"{candidate.requests} requests in {candidate.conversations} conversations",
            figures,
        )
    # The count furthest behind, as a share of its threshold, sets the wait.
    behind = min(
        _share(candidate.requests, config.min_requests),
        _share(candidate.conversations, config.min_conversations),
    )
    return GateResult(
        "traffic",
        Verdict.INCONCLUSIVE,
        f"need {config.min_requests} candidate requests (rollout.gates.min_requests) in "
        f"{config.min_conversations} conversations (rollout.gates.min_conversations); have "
        f"{candidate.requests} in {candidate.conversations}" + eta(behind, 1.0, candidate.span_s),
        figures,
        needed_conversations=max(0, config.min_conversations - candidate.conversations),
    )


def _share(have: int, need: int) -> float:
    return have / need if need else 1.0


@dataclass(frozen=True, slots=True)
class RollbackConfig:
    """enabled: whether running proxies pull a failing candidate out by themselves.
    window_seconds: the rolling window they watch.
    min_requests: candidate requests in the window before any verdict.
    max_error_rate: absolute candidate error rate that triggers a rollback.
    error_rate_margin: ... or the primary's error rate plus this margin, whichever is higher.
    ttft_p95_factor: candidate TTFT p95 above this multiple of the primary's triggers it.
    ttft_p95_ms: ... or above this absolute value (None: not used).
    ttft_floor_ms: the ratio trigger needs the candidate's p95 above this too, so a 4x jump
        from 2 ms to 8 ms pulls nothing out.
    max_invalid_tool_call_rate / min_tool_calls: the share of the candidate's tool calls that
        name an unoffered tool or carry broken JSON arguments (a misconfigured tool parser).
    """

    enabled: bool = True
    window_seconds: float = 30.0
    min_requests: int = 20
    max_error_rate: float = 0.2
    error_rate_margin: float = 0.1
    ttft_p95_factor: float = 4.0
    ttft_p95_ms: float | None = None
    ttft_floor_ms: float = 250.0
    max_invalid_tool_call_rate: float = 0.2
    min_tool_calls: int = 5


def rollback_reason(
    primary: BackendWindow, candidate: BackendWindow, config: RollbackConfig
) -> str | None:
    """Why the candidate must be pulled out now, or None while it behaves."""
    if not config.enabled or candidate.requests < config.min_requests:
        return None
    error_limit = max(config.max_error_rate, primary.error_rate + config.error_rate_margin)
    if candidate.error_rate > error_limit:
        return (
            f"candidate error rate {candidate.error_rate:.1%} over {error_limit:.1%} "
            f"({candidate.errors}/{candidate.requests} in {config.window_seconds:g}s)"
        )
    if candidate.tool_calls >= config.min_tool_calls:
        rate = candidate.invalid_tool_calls / candidate.tool_calls
        if rate > config.max_invalid_tool_call_rate:
            return (
                f"{rate:.0%} of the candidate's tool calls are broken "
                f"({candidate.invalid_tool_calls}/{candidate.tool_calls}: unknown tool or "
                "invalid JSON arguments)"
            )
    # Streamed answers give TTFT; clients that never stream are judged on total latency.
    measure, p95, base = "TTFT", candidate.ttft_p95, primary.ttft_p95
    if p95 is None:
        measure, p95, base = "latency", candidate.latency_p95, primary.latency_p95
    if p95 is None:
        return None
    ms = p95 * 1000
    if config.ttft_p95_ms is not None and ms > config.ttft_p95_ms:
        return f"candidate {measure} p95 {ms:.0f} ms over {config.ttft_p95_ms:g} ms"
    if base is not None and ms > config.ttft_floor_ms and p95 > base * config.ttft_p95_factor:
        return (
            f"candidate {measure} p95 {ms:.0f} ms over {config.ttft_p95_factor:g} x "
            f"primary {base * 1000:.0f} ms"
        )
    return None
