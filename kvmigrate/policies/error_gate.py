"""The error-rate gate: an interval on the candidate's error rate minus the primary's.

Newcombe's hybrid score interval on the difference, at the always-valid z of each sample
size; Passed when its upper end is within `error_rate_margin`, Failed when its lower end is
beyond it. With no primary traffic in the window the candidate's own Wilson interval is held
to the margin alone.
"""

from __future__ import annotations

from kvmigrate.intervals import Interval, newcombe_difference, wilson
from kvmigrate.policies.gate_model import (
    GateConfig,
    GateResult,
    bounds,
    still_needed,
    too_few_requests,
)
from kvmigrate.policies.sequential import (
    Verdict,
    always_valid_z,
    judge,
    more_needed,
    needed_scale,
)
from kvmigrate.policies.window import BackendWindow


def error_difference(
    primary: BackendWindow, candidate: BackendWindow, config: GateConfig, scale: float = 1.0
) -> tuple[float, Interval]:
    """Candidate minus primary error rate and its interval, with both samples `scale` times
    as large at the same rates (to ask how much evidence a verdict needs)."""

    def z(n: float) -> float:
        return always_valid_z(n, config.confidence, config.min_requests)

    n1 = max(1, round(candidate.requests * scale))
    k1 = round(candidate.error_rate * n1)
    if primary.requests == 0:
        return k1 / n1, wilson(k1, n1, z(n1))
    n2 = max(1, round(primary.requests * scale))
    k2 = round(primary.error_rate * n2)
    return newcombe_difference(k1, n1, k2, n2, z(n1), z(n2))


def error_gate(primary: BackendWindow, candidate: BackendWindow, config: GateConfig) -> GateResult:
    margin = config.error_rate_margin
    figures = {
        "candidate_error_rate": round(candidate.error_rate, 5),
        "primary_error_rate": round(primary.error_rate, 5),
        "candidate_errors": candidate.errors,
        "candidate_requests": candidate.requests,
        "primary_errors": primary.errors,
        "primary_requests": primary.requests,
        "margin": margin,
    }
    if candidate.requests < config.min_requests:
        return GateResult(
            "error_rate",
            Verdict.INCONCLUSIVE,
            too_few_requests(candidate, config, "an error rate"),
            figures,
            threshold=margin,
        )

    def verdict_at(scale: float) -> Verdict:
        _, iv = error_difference(primary, candidate, config, scale)
        return judge(iv.low, iv.high, margin, higher_is_better=False)

    difference, interval = error_difference(primary, candidate, config)
    verdict = verdict_at(1.0)
    more = None
    detail = (
        f"candidate {candidate.error_rate:.2%} - primary {primary.error_rate:.2%} = "
        f"{_points(difference)} [{_points(interval.low)}, {_points(interval.high)}] vs "
        f"margin {_points(margin)} (rollout.gates.error_rate_margin)"
    )
    if verdict is Verdict.INCONCLUSIVE:
        more = more_needed(candidate.conversations, needed_scale(verdict_at))
        detail += still_needed(candidate, more)
    return GateResult(
        "error_rate",
        verdict,
        detail,
        figures,
        estimate=round(difference, 5),
        threshold=margin,
        needed_conversations=more,
        **bounds(interval),
    )


def _points(rate: float) -> str:
    """A rate difference in percentage points, signed."""
    return f"{rate * 100:+.2f} pts"
