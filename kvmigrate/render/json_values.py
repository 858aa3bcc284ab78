"""Figures as JSON values: JSON has no NaN or Infinity, so a figure nothing measured (a TTFT
no request reached, a rate of nothing) is null, in the report's and the plan's JSON alike."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every non-finite float, however deep in dicts and lists, as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
