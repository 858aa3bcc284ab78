"""Formatting of report figures: missing values print as an em dash, never as NaN."""

from __future__ import annotations

import math
import time

MISSING = "—"


def _ok(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def ms(value: float | None) -> str:
    if not _ok(value):
        return MISSING
    assert value is not None
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms"


def pct(value: float | None, ratio: bool = True, signed: bool = False) -> str:
    """A ratio (0..1) or, with ratio=False, a value already in percent."""
    if not _ok(value):
        return MISSING
    assert value is not None
    shown = value * 100 if ratio else value
    return f"{shown:+.1f}%" if signed else f"{shown:.1f}%"


def usd(value: float | None) -> str:
    if not _ok(value):
        return MISSING
    assert value is not None
    return f"-${-value:,.2f}" if value < 0 else f"${value:,.2f}"


def number(value: float | None, digits: int = 0) -> str:
    if not _ok(value):
        return MISSING
    assert value is not None
    return f"{value:,.{digits}f}"


def when(ts: float | None) -> str:
    if not _ok(ts):
        return MISSING
    assert ts is not None
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def duration(seconds: float) -> str:
    if seconds >= 2 * 86_400:
        return f"{seconds / 86_400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"
