"""GPU utilisation and KV-cache use over the window, as percent-over-time series for the
HTML report's chart: each scrape round one point (the mean of what it read), at most
`MAX_POINTS` per series (evenly spaced buckets of the window, averaged)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kvmigrate.engine.samples import ScrapeResult

MAX_POINTS = 240


@dataclass(frozen=True, slots=True)
class UseSeries:
    name: str  # "GPU utilisation", or "<backend> KV cache"
    points: tuple[tuple[float, float], ...]  # (Unix time, percent)


def use_series(results: Sequence[ScrapeResult]) -> tuple[UseSeries, ...]:
    rounds: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.gpu is not None:
            rounds["GPU utilisation"][r.ts].append(r.gpu.util_pct)
        elif r.engine is not None and r.engine.kv_usage is not None:
            rounds[f"{r.backend} KV cache"][r.ts].append(r.engine.kv_usage * 100.0)
    return tuple(
        UseSeries(name, _thinned([(ts, sum(v) / len(v)) for ts, v in sorted(by_ts.items())]))
        for name, by_ts in rounds.items()
    )


def _thinned(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    if len(points) <= MAX_POINTS:
        return tuple(points)
    start, end = points[0][0], points[-1][0]
    width = (end - start) / MAX_POINTS
    buckets: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for ts, value in points:
        buckets[min(int((ts - start) / width), MAX_POINTS - 1)].append((ts, value))
    return tuple(
        (sum(t for t, _ in b) / len(b), sum(v for _, v in b) / len(b))
        for _, b in sorted(buckets.items())
    )
