"""Helpers for the gates' report tables."""

from __future__ import annotations

import random
from typing import Any


def rounded(value: Any) -> Any:
    """Floats to 9 significant digits, in nested lists and dicts: the rows' figures, not
    the last bit of a logarithm."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def spread(n: int, low: float, high: float, seed: int) -> tuple[float, ...]:
    """n values drawn uniformly in [low, high], rounded to 0.1 ms: a seeded window sample."""
    draw = random.Random(seed)
    return tuple(round(draw.uniform(low, high), 4) for _ in range(n))
