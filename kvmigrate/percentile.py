"""Percentiles without numpy: linear interpolation between closest ranks (numpy's default)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values`; None for no values (never NaN)."""
    return percentiles(values, (q,))[0]


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float | None]:
    """Several percentiles of `values`, sorted once (a plan takes p50 and p95 of 100,000
    TTFTs per fleet size, and the sort was most of its figures' time)."""
    data = sorted(v for v in values if v is not None and math.isfinite(v))
    if not data:
        return [None] * len(qs)
    return [_interpolate(data, q) for q in qs]


def _interpolate(data: list[float], q: float) -> float:
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)
