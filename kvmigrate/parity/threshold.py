"""`parity --min-score`: decide from the intervals, like the rollout gates, not the estimate.

A point estimate compared with a threshold fails a candidate that differs from the primary
only by sampling whenever the estimate happens to dip below it, which on a few dozen requests
is often. So each conclusive comparator's noise-adjusted parity interval is judged against
the threshold: passed when its lower bound reaches it, failed when its upper bound lies
below it, inconclusive when it straddles it. The run passes when every conclusive comparator
passes and fails when any fails; otherwise it is inconclusive, with the requests still
needed at the rates observed (`policies.sequential.needed_scale`).

One CI run looks once, so the interval is the fixed-sample one at the report's confidence,
not the rollout gates' always-valid one.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmigrate.intervals import Interval, newcombe_difference, z_for
from kvmigrate.parity.noise import CONCLUSIVE, ComparatorParity, ParityReport
from kvmigrate.policies.sequential import Verdict, judge, more_needed, needed_scale


@dataclass(frozen=True, slots=True)
class ComparatorDecision:
    name: str
    parity: float
    interval: Interval
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class ThresholdDecision:
    """verdict: over every conclusive comparator. deciding: the comparator that set it (the
    failing one with the lowest upper bound, else the one with the lowest lower bound).
    more_requests: requests still needed for a verdict when inconclusive (None when not
    even many times today's would decide: an estimate sitting on the threshold)."""

    verdict: Verdict
    comparators: tuple[ComparatorDecision, ...]
    deciding: ComparatorDecision
    more_requests: int | None = None


def comparator_decision(
    c: ComparatorParity, min_score: float, confidence: float, scale: float = 1.0
) -> ComparatorDecision:
    """One comparator's verdict, with every count scaled by `scale` at the observed rates."""
    n1, n2 = round(c.candidate_n * scale), round(c.noise_n * scale)
    k1 = round(c.candidate_disagree / c.candidate_n * n1)
    k2 = round(c.noise_disagree / c.noise_n * n2)
    excess, iv = newcombe_difference(k1, n1, k2, n2, z_for(confidence))
    interval = Interval(1.0 - max(0.0, iv.high), 1.0 - max(0.0, iv.low))
    verdict = judge(interval.low, interval.high, min_score, higher_is_better=True)
    return ComparatorDecision(c.name, 1.0 - max(0.0, excess), interval, verdict)


def overall(decisions: tuple[ComparatorDecision, ...]) -> Verdict:
    verdicts = {d.verdict for d in decisions}
    if Verdict.FAILED in verdicts:
        return Verdict.FAILED
    if verdicts == {Verdict.PASSED}:
        return Verdict.PASSED
    return Verdict.INCONCLUSIVE


def decide(report: ParityReport, min_score: float, requests: int) -> ThresholdDecision | None:
    """The verdict on a conclusive report (None when no comparator is conclusive).
    `requests`: the requests scored, to say how many more an inconclusive run needs."""
    conclusive = [c for c in report.comparators if c.status == CONCLUSIVE and c.noise_n > 0]
    if not conclusive:
        return None

    def at(scale: float) -> tuple[ComparatorDecision, ...]:
        return tuple(
            comparator_decision(c, min_score, report.confidence, scale) for c in conclusive
        )

    decisions = at(1.0)
    verdict = overall(decisions)
    if verdict is Verdict.FAILED:
        failing = [d for d in decisions if d.verdict is Verdict.FAILED]
        deciding = min(failing, key=lambda d: (d.interval.high, d.name))
    else:
        deciding = min(decisions, key=lambda d: (d.interval.low, d.name))
    more = None
    if verdict is Verdict.INCONCLUSIVE:
        more = more_needed(requests, needed_scale(lambda s: overall(at(s))))
    return ThresholdDecision(verdict, decisions, deciding, more)
