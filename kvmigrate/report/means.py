"""Intervals for a mean and for the difference of two means (Welch), with Cohen's d.

Turns per conversation and satisfaction scores are counts and ratings, not rates, so
`kvmigrate.intervals` (Wilson, Newcombe) does not apply. Welch's interval does not assume
the two arms spread alike; its t quantile comes from the normal one by the Cornish-Fisher
expansion (Abramowitz and Stegun 26.7.5), close enough at the sample sizes a report shows,
and the standard library has no t distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvmigrate.intervals import Interval


@dataclass(frozen=True, slots=True)
class MeanDifference:
    """a - b, its interval, and Cohen's d (the difference over the pooled spread)."""

    difference: float
    interval: Interval
    cohens_d: float | None


def t_quantile(z: float, df: float) -> float:
    """The t quantile matching the normal quantile `z` at `df` degrees of freedom."""
    if not math.isfinite(df):
        return z
    df = max(df, 1.0)
    z3, z5 = z**3, z**5
    return (
        z
        + (z3 + z) / (4 * df)
        + (5 * z5 + 16 * z3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * df**3)
    )


def mean_and_variance(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, variance


def mean_interval(values: Sequence[float], z: float) -> Interval:
    """Student's interval for the mean; unbounded with fewer than two values."""
    n = len(values)
    if n < 2:
        return Interval(-math.inf, math.inf)
    mean, variance = mean_and_variance(values)
    half = t_quantile(z, n - 1) * math.sqrt(variance / n)
    return Interval(mean - half, mean + half)


def welch_difference(a: Sequence[float], b: Sequence[float], z: float) -> MeanDifference | None:
    """mean(a) - mean(b) with Welch's interval; None with fewer than two values a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    (ma, va), (mb, vb) = mean_and_variance(a), mean_and_variance(b)
    sa, sb = va / len(a), vb / len(b)
    difference = ma - mb
    se = math.sqrt(sa + sb)
    if se == 0.0:
        return MeanDifference(difference, Interval(difference, difference), None)
    df = (sa + sb) ** 2 / (sa**2 / (len(a) - 1) + sb**2 / (len(b) - 1))
    half = t_quantile(z, df) * se
    pooled = math.sqrt(((len(a) - 1) * va + (len(b) - 1) * vb) / (len(a) + len(b) - 2))
    d = difference / pooled if pooled > 0 else None
    return MeanDifference(difference, Interval(difference - half, difference + half), d)
