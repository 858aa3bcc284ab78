"""Whether TTFT stays flat as conversations grow: its slope across turns, and its level
from the tenth turn on (the playbook's "under 3 s even past 10 turns").

The slope is ordinary least squares of TTFT (ms) on the turn number over every timed call
of a backend. Its 95% interval uses a cluster-robust standard error, the conversations
being the clusters: the turns of one conversation share its prompt and its cache, so
treating them as independent would make the interval too narrow. With fewer than
`MIN_CONVERSATIONS` conversations, or one turn number only, there is no interval."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kvmigrate.intervals import Interval, quantile_interval, z_for
from kvmigrate.percentile import percentile
from kvmigrate.report.aggregate import succeeded
from kvmigrate.report.model import Flatness
from kvmigrate.report.rows import Row

CONFIDENCE = 0.95
LATE_TURN = 10  # "past 10 turns": the tenth turn and every later one
MIN_CONVERSATIONS = 5


@dataclass(frozen=True, slots=True)
class Slope:
    estimate: float
    interval: Interval | None  # None: too few conversations or turn numbers to bound it


def slope(points: Sequence[tuple[str, float, float]]) -> Slope | None:
    """OLS slope of y on x over (cluster, x, y) points, with a 95% interval from the
    cluster-robust (CR1) standard error. None when every x is the same."""
    n = len(points)
    if n < 2:
        return None
    mean_x = sum(x for _, x, _ in points) / n
    mean_y = sum(y for _, _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for _, x, _ in points)
    if sxx <= 0:
        return None
    b = sum((x - mean_x) * (y - mean_y) for _, x, y in points) / sxx
    a = mean_y - b * mean_x
    scores: defaultdict[str, float] = defaultdict(float)
    for cluster, x, y in points:
        scores[cluster] += (x - mean_x) * (y - a - b * x)
    g = len(scores)
    if g < MIN_CONVERSATIONS:
        return Slope(b, None)
    # CR1: the small-sample correction of the sandwich estimator.
    correction = g / (g - 1) * (n - 1) / (n - 2) if n > 2 else g / (g - 1)
    se = math.sqrt(correction * sum(s * s for s in scores.values())) / sxx
    half = z_for(CONFIDENCE) * se
    return Slope(b, Interval(b - half, b + half))


def flatness(rows: Sequence[Row], backends: Sequence[str]) -> list[Flatness]:
    """Per backend with timed (streamed, answered) calls."""
    out = []
    for backend in backends:
        timed = [
            r
            for r in rows
            if r.backend == backend and r.ttft_ms is not None and succeeded(r) and r.turn >= 1
        ]
        if timed:
            out.append(_backend(backend, timed))
    return out


def _backend(backend: str, timed: Sequence[Row]) -> Flatness:
    fit = slope([(r.conversation, float(r.turn), r.ttft_ms or 0.0) for r in timed])
    late = sorted(r.ttft_ms or 0.0 for r in timed if r.turn >= LATE_TURN)
    interval = quantile_interval(late, 0.95, z_for(CONFIDENCE), len(late))
    low = high = None
    if fit is not None and fit.interval is not None:
        low, high = fit.interval.low, fit.interval.high
    return Flatness(
        backend=backend,
        calls=len(timed),
        conversations=len({r.conversation for r in timed}),
        slope_ms_per_turn=fit.estimate if fit else None,
        slope_low=low,
        slope_high=high,
        late_turn=LATE_TURN,
        late_n=len(late),
        late_p50_ms=percentile(late, 50),
        late_p95_ms=percentile(late, 95),
        late_p95_low=_finite(interval.low) if late else None,
        late_p95_high=_finite(interval.high) if late else None,
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
