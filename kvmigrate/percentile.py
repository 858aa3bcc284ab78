"""Percentiles without numpy: linear interpolation between closest ranks (numpy's default)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of `values`; None for no values (never NaN)."""
    data = sorted(v for v in values if v is not None and math.isfinite(v))
    if not data:
        return None
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)
