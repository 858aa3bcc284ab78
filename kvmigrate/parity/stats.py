"""Confidence intervals for disagreement rates and their difference.

Wilson's score interval for one proportion, and Newcombe's hybrid score interval (his
method 10, 1998) for the difference of two independent proportions, built from the two
Wilson intervals. Both behave at the edges (0 of n, n of n) and with small samples, where
the textbook normal interval gives nonsense such as negative rates.
"""

from __future__ import annotations

import math
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


def newcombe_difference(k1: int, n1: int, k2: int, n2: int, z: float) -> tuple[float, Interval]:
    """p1 - p2 and its interval, for k1 of n1 against k2 of n2."""
    p1, p2 = k1 / n1, k2 / n2
    a, b = wilson(k1, n1, z), wilson(k2, n2, z)
    difference = p1 - p2
    low = difference - math.sqrt((p1 - a.low) ** 2 + (b.high - p2) ** 2)
    high = difference + math.sqrt((a.high - p1) ** 2 + (p2 - b.low) ** 2)
    return difference, Interval(max(-1.0, low), min(1.0, high))
