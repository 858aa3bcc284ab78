"""Confidence intervals: for rates and their difference, for a quantile, for a ratio.

Wilson's score interval for one proportion, and Newcombe's hybrid score interval (his
method 10, 1998) for the difference of two independent proportions, built from the two
Wilson intervals. Both behave at the edges (0 of n, n of n) and with small samples, where
the textbook normal interval gives nonsense such as negative rates. Parity's noise floor and
the promotion gates (`policies`) both read them, so they live outside either package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True, slots=True)
class Interval:
    low: float
    high: float


def z_for(confidence: float) -> float:
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)


def wilson(successes: int, n: int, z: float) -> Interval:
    if n <= 0:
        return Interval(0.0, 1.0)
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0 of n and n of n the bound is exactly 0 or 1; rounding would leave 1e-17.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(low, high)


def newcombe_difference(
    k1: int, n1: int, k2: int, n2: int, z: float, z2: float | None = None
) -> tuple[float, Interval]:
    """p1 - p2 and its interval, for k1 of n1 against k2 of n2. `z2`: the second
    proportion's z when it differs (an always-valid z depends on each sample's size)."""
    p1, p2 = k1 / n1, k2 / n2
    a, b = wilson(k1, n1, z), wilson(k2, n2, z if z2 is None else z2)
    difference = p1 - p2
    low = difference - math.sqrt((p1 - a.low) ** 2 + (b.high - p2) ** 2)
    high = difference + math.sqrt((a.high - p1) ** 2 + (p2 - b.low) ** 2)
    return difference, Interval(max(-1.0, low), min(1.0, high))


def quantile_interval(ordered: Sequence[float], q: float, z: float, n: float) -> Interval:
    """Distribution-free interval for the q-quantile (0..1) from sorted sample values: the
    order statistics whose ranks bound the quantile's, the number of values below it being
    Binomial(n, q) (normal approximation, with the one-rank correction on the high side).
    `n` may exceed len(ordered) to ask what the interval would be with more samples drawn
    like these. The upper bound is infinite where the sample cannot bound the quantile from
    above (a p95 from 100 values at z = 3)."""
    size = len(ordered)
    if size == 0 or n <= 0:
        return Interval(-math.inf, math.inf)
    spread = z * math.sqrt(n * q * (1.0 - q))
    low_rank = math.floor(n * q - spread)  # 1-based ranks in a sample of n
    high_rank = math.ceil(n * q + spread) + 1
    low_index = math.floor(low_rank / n * size) - 1  # ... read off the sample we have
    high_index = math.ceil(high_rank / n * size) - 1
    low = ordered[low_index] if low_index >= 0 else -math.inf
    high = ordered[high_index] if high_index < size else math.inf
    return Interval(low, high)


def log_ratio_interval(
    top: float, top_interval: Interval, bottom: float, bottom_interval: Interval
) -> Interval:
    """Interval for top / bottom from each one's own interval: Newcombe's construction
    (MOVER, Zou and Donner 2008) on the logarithms, so neither sample's spread is ignored."""
    if min(top, bottom, top_interval.low, bottom_interval.low) <= 0:
        return Interval(0.0, math.inf)
    t, b = math.log(top), math.log(bottom)
    down = math.hypot(t - math.log(top_interval.low), _log(bottom_interval.high) - b)
    up = math.hypot(_log(top_interval.high) - t, b - math.log(bottom_interval.low))
    # The ratio itself, not exp(log - log): a ratio exactly on a threshold stays on it.
    ratio = top / bottom
    return Interval(
        ratio * math.exp(-down), ratio * math.exp(up) if math.isfinite(up) else math.inf
    )


def _log(value: float) -> float:
    return math.inf if math.isinf(value) else math.log(value)
