"""Promotion gates and the auto-rollback trigger: pure functions over windows of traffic.

Each gate answers Passed, Failed or Inconclusive (not enough data to say) with the figures
behind the verdict, so a refused promotion explains itself. A promotion needs every gate
Passed; `--force` overrides, and the override is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvmigrate.policies.window import BackendWindow


class Verdict(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True, slots=True)
class GateConfig:
    """min_conversations / min_requests: the candidate traffic a verdict needs.
    error_rate_margin: the candidate's error rate may exceed the primary's by this much.
    ttft_p95_slo_ms: an absolute TTFT p95 target for the candidate (None: not used).
    ttft_p95_factor: ... or at most this multiple of the primary's TTFT p95.
    ttft_p95_floor_ms: a candidate p95 under this always passes: 3 x a 2 ms TTFT is noise,
        not a regression.
    min_parity / min_parity_samples: noise-adjusted parity needed (None: gate off).
    window_seconds: how far back the evidence reaches (never before the last change).
    """

    min_conversations: int = 20
    min_requests: int = 100
    error_rate_margin: float = 0.01
    ttft_p95_slo_ms: float | None = None
    ttft_p95_factor: float = 1.5
    ttft_p95_floor_ms: float = 100.0
    min_parity: float | None = None
    min_parity_samples: int = 30
    window_seconds: float = 3600.0


@dataclass(frozen=True, slots=True)
class GateResult:
    name: str
    verdict: Verdict
    detail: str
    figures: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict.value,
            "detail": self.detail,
            "figures": self.figures,
        }


def evaluate_gates(
    primary: BackendWindow, candidate: BackendWindow, config: GateConfig
) -> list[GateResult]:
    results = [
        _traffic_gate(candidate, config),
        _error_gate(primary, candidate, config),
        _ttft_gate(primary, candidate, config),
    ]
    if config.min_parity is not None:
        results.append(_parity_gate(candidate, config))
    return results


def render_gates(gates: list[dict[str, Any]]) -> str:
    """One line per gate (`GateResult.to_dict()` shape), as the CLI and the demo print them."""
    marks = {"passed": "PASS", "failed": "FAIL", "inconclusive": "WAIT"}
    return "\n".join(
        f"  {marks.get(g['verdict'], '?'):4}  {g['name']:<11} {g['detail']}" for g in gates
    )


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
        f"{candidate.requests} in {candidate.conversations}" + _eta(behind, 1.0, candidate.span_s),
        figures,
    )


def _share(have: int, need: int) -> float:
    return have / need if need else 1.0


def _too_few_requests(candidate: BackendWindow, config: GateConfig, what: str) -> str:
    return (
        f"need {config.min_requests} candidate requests (rollout.gates.min_requests) before "
        f"{what} counts; have {candidate.requests}"
        + _eta(candidate.requests, config.min_requests, candidate.span_s)
    )


def _eta(have: float, need: float, span_s: float) -> str:
    """How long the missing evidence takes at the rate it arrived so far, if it arrived."""
    if have >= need:
        return ""
    if span_s < 1.0:
        return ""
    if have <= 0:
        return f"; none in the last {_duration(span_s)}"
    left = (need - have) * span_s / have
    return f"; at the current rate ({_duration(span_s)} so far) about {_duration(left)} more"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _error_gate(primary: BackendWindow, candidate: BackendWindow, config: GateConfig) -> GateResult:
    limit = primary.error_rate + config.error_rate_margin
    figures = {
        "candidate_error_rate": round(candidate.error_rate, 5),
        "primary_error_rate": round(primary.error_rate, 5),
        "limit": round(limit, 5),
    }
    if candidate.requests < config.min_requests:
        return GateResult(
            "error_rate",
            Verdict.INCONCLUSIVE,
            _too_few_requests(candidate, config, "an error rate"),
            figures,
        )
    verdict = Verdict.PASSED if candidate.error_rate <= limit else Verdict.FAILED
    return GateResult(
        "error_rate",
        verdict,
        f"candidate {candidate.error_rate:.2%} vs limit {limit:.2%} "
        f"(primary {primary.error_rate:.2%} + {config.error_rate_margin:.2%})",
        figures,
    )


def _ttft_gate(primary: BackendWindow, candidate: BackendWindow, config: GateConfig) -> GateResult:
    # Streamed answers give TTFT; when the window has none (clients that do not stream),
    # total latency is the figure a user waits for, and is compared the same way.
    measure, cand, prim = "TTFT p95", candidate.ttft_p95, primary.ttft_p95
    if cand is None and candidate.latency_p95 is not None:
        measure, cand, prim = (
            "latency p95 (nothing streamed)",
            candidate.latency_p95,
            primary.latency_p95,
        )
    figures: dict[str, Any] = {
        "measure": measure,
        "candidate_p95_ms": _ms(cand),
        "primary_p95_ms": _ms(prim),
        "slo_ms": config.ttft_p95_slo_ms,
        "factor": config.ttft_p95_factor,
    }
    if cand is None:
        return GateResult(
            "ttft_p95",
            Verdict.INCONCLUSIVE,
            f"no candidate TTFT or latency recorded yet; have {candidate.requests} requests",
            figures,
        )
    if candidate.requests < config.min_requests:
        return GateResult(
            "ttft_p95",
            Verdict.INCONCLUSIVE,
            _too_few_requests(candidate, config, f"its {measure}"),
            figures,
        )
    ms = cand * 1000
    if ms <= config.ttft_p95_floor_ms:
        return GateResult(
            "ttft_p95",
            Verdict.PASSED,
            f"candidate {measure} {ms:.0f} ms, under the {config.ttft_p95_floor_ms:g} ms floor",
            figures,
        )
    if config.ttft_p95_slo_ms is not None and ms <= config.ttft_p95_slo_ms:
        return GateResult(
            "ttft_p95",
            Verdict.PASSED,
            f"candidate {measure} {ms:.0f} ms within the {config.ttft_p95_slo_ms:g} ms SLO",
            figures,
        )
    if prim is None:
        if config.ttft_p95_slo_ms is not None:
            return GateResult(
                "ttft_p95",
                Verdict.FAILED,
                f"candidate {measure} {ms:.0f} ms over the {config.ttft_p95_slo_ms:g} ms SLO",
                figures,
            )
        return GateResult(
            "ttft_p95",
            Verdict.INCONCLUSIVE,
            f"no primary {measure} to compare with (rollout.gates.ttft_p95_factor); set "
            "rollout.gates.ttft_p95_slo_ms for an absolute target",
            figures,
        )
    limit = prim * 1000 * config.ttft_p95_factor
    verdict = Verdict.PASSED if ms <= limit else Verdict.FAILED
    return GateResult(
        "ttft_p95",
        verdict,
        f"candidate {measure} {ms:.0f} ms vs {limit:.0f} ms "
        f"({config.ttft_p95_factor:g} x primary {prim * 1000:.0f} ms)",
        figures,
    )


def _parity_gate(candidate: BackendWindow, config: GateConfig) -> GateResult:
    assert config.min_parity is not None
    figures = {
        "parity": candidate.parity,
        "samples": candidate.parity_samples,
        "min_parity": config.min_parity,
        "min_parity_samples": config.min_parity_samples,
        "noise_pairs": candidate.noise_pairs,
        "noise_needed": candidate.noise_needed,
    }
    if candidate.parity is None or candidate.parity_samples < config.min_parity_samples:
        return GateResult("parity", Verdict.INCONCLUSIVE, _parity_wait(candidate, config), figures)
    verdict = Verdict.PASSED if candidate.parity >= config.min_parity else Verdict.FAILED
    return GateResult(
        "parity",
        verdict,
        f"noise-adjusted parity {candidate.parity:.3f} vs {config.min_parity:g}",
        figures,
    )


def _parity_wait(candidate: BackendWindow, config: GateConfig) -> str:
    """What parity still lacks: scored pairs, or the noise floor they are measured against."""
    have, need, span = candidate.parity_samples, config.min_parity_samples, candidate.span_s
    noise, floor = candidate.noise_pairs, candidate.noise_needed
    if have < need:
        also = f"; and {noise} of the {floor} noise pairs" if noise < floor else ""
        return (
            f"need {need} scored pairs (rollout.gates.min_parity_samples); have {have}"
            + _eta(have, need, span)
            + also
        )
    return (
        f"{have} scored pairs are in, but the noise floor needs {floor} primary-vs-primary "
        f"pairs; have {noise}" + _eta(noise, floor, span) + ". Raise rollout.noise_sample "
        "(share of conversations sent to the primary twice) or rollout.noise_per_minute"
    )


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


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
