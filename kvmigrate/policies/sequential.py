"""Always-valid intervals, so a gate may be looked at as often as anyone likes.

`rollout auto` evaluates the gates every few seconds during a bake, `rollout status` and the
admin API whenever someone asks. A fixed-sample 95% interval checked at every look would
cross a threshold by chance far more often than 5% of the time over a long bake. Instead
every interval the gates compute uses the time-uniform boundary of an asymptotic confidence
sequence (Waudby-Smith, Arnold, Wu, Howard and Ramdas, "Time-uniform central limit theory
and asymptotic confidence sequences", 2024; the normal-mixture boundary of Howard et al.,
2021): with probability 1 - alpha the interval holds at every sample size at once, so the
number of looks does not matter and nobody has to count them. It is applied in score form
(`always_valid_z` replaces the fixed z of Wilson's and Newcombe's intervals), so rates stay
inside [0, 1] and behave at 0 of n.

The boundary is tightest near `tuned_for` samples (the gate's minimum), about 1.6 times a
fixed-sample interval's width there, and widens slowly (as sqrt(log n)) beyond.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum


class Verdict(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"


def always_valid_z(n: float, confidence: float, tuned_for: float) -> float:
    """The z that makes a normal interval at sample size `n` part of a two-sided confidence
    sequence at level `confidence`, tightest around `tuned_for` samples."""
    alpha = 1.0 - confidence
    tuned = max(1.0, tuned_for)
    rho2 = (-2.0 * math.log(alpha) + math.log(1.0 - 2.0 * math.log(alpha))) / tuned
    v = max(1.0, n) * rho2
    return math.sqrt(2.0 * (v + 1.0) / v * math.log(math.sqrt(v + 1.0) / alpha))


def judge(low: float, high: float, threshold: float, higher_is_better: bool) -> Verdict:
    """Passed when the whole interval is on the good side of the threshold (touching it
    counts), Failed when it lies wholly beyond it, Inconclusive when it straddles it."""
    if higher_is_better:
        low, high, threshold = -high, -low, -threshold
    if high <= threshold:
        return Verdict.PASSED
    if low > threshold:
        return Verdict.FAILED
    return Verdict.INCONCLUSIVE


def needed_scale(verdict_at: Callable[[float], Verdict], most: float = 1000.0) -> float | None:
    """How many times today's evidence a decision needs at the observed rates: the smallest
    factor s (>= 1) for which `verdict_at(s)`, the verdict with every count scaled by s, is
    no longer Inconclusive. None when not even `most` times the evidence would decide (an
    estimate sitting on the threshold)."""
    if verdict_at(1.0) is not Verdict.INCONCLUSIVE:
        return 1.0
    if verdict_at(most) is Verdict.INCONCLUSIVE:
        return None
    low, high = 1.0, most
    while high / low > 1.02:
        middle = math.sqrt(low * high)
        if verdict_at(middle) is Verdict.INCONCLUSIVE:
            low = middle
        else:
            high = middle
    return high


def more_needed(have: int, scale: float | None) -> int | None:
    """Units (conversations, requests) still to come for `have` to grow by `scale`."""
    if scale is None:
        return None
    return max(0, math.ceil(have * scale) - have)
