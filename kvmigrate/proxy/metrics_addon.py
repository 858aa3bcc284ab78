"""The addon that turns finished exchanges into Prometheus metrics.

An exchange's figures are tallied in plain dicts on the response path, and folded into the
Prometheus metrics at every scrape (`ProxyMetrics.render`) and every `FOLD_INTERVAL_S`.
Updating the metrics per exchange (a labelled child found, a lock per value, a histogram's
buckets scanned, seven times) took 5.8 us of the event loop's time per exchange, twice for
a shadowed request; the tally takes 2.8. With `--workers` a scrape sees the other workers'
figures at most `FOLD_INTERVAL_S` late, as it sees their snapshots (`pool_metrics`).
"""

from __future__ import annotations

import asyncio
import math
from bisect import bisect_left
from collections import defaultdict
from typing import Any

from prometheus_client import Histogram

from kvmigrate.exchange import Exchange
from kvmigrate.proxy.metrics import LATENCY_BUCKETS, ProxyMetrics, add_observations

FOLD_INTERVAL_S = 1.0
_BOUNDS = (*LATENCY_BUCKETS, math.inf)  # as Histogram keeps them: +Inf last


class MetricsAddon:
    def __init__(self, metrics: ProxyMetrics) -> None:
        self.metrics = metrics
        # (metric, *labels) -> the amount to add; (histogram, *labels) -> counts per bucket,
        # then the sum of the values.
        self._counts: defaultdict[tuple[Any, ...], float] = defaultdict(float)
        self._observed: dict[tuple[Any, ...], list[float]] = {}
        self._timer: asyncio.TimerHandle | None = None
        metrics.before_render.append(self.fold)

    def exchange_done(self, exchange: Exchange) -> None:
        m, counts = self.metrics, self._counts
        backend, role, cohort = exchange.backend, exchange.role, exchange.cohort
        status = str(exchange.status) if exchange.status is not None else "none"
        counts[(m.requests, backend, role, exchange.route, status, cohort)] += 1
        if exchange.error is not None:
            counts[(m.errors, backend, role, exchange.error, cohort)] += 1
        elif exchange.status is not None and exchange.status >= 400:
            counts[(m.errors, backend, role, f"http_{exchange.status}", cohort)] += 1
        if (ttft := exchange.ttft) is not None:
            self._observe(m.ttft, ttft, backend, role, cohort)
        if (duration := exchange.duration) is not None:
            self._observe(m.latency, duration, backend, role, cohort)
        for kind, count in exchange.token_counts().items():
            counts[(m.tokens, backend, role, kind)] += count

    def _observe(self, histogram: Histogram, value: float, *labels: str) -> None:
        key = (histogram, *labels)
        tally = self._observed.get(key)
        if tally is None:
            tally = self._observed[key] = [0.0] * (len(_BOUNDS) + 1)
        tally[bisect_left(_BOUNDS, value)] += 1  # the first bucket whose bound >= value
        tally[-1] += value

    def fold(self) -> None:
        """Add what was tallied since the last fold to the Prometheus metrics."""
        counts, self._counts = self._counts, defaultdict(float)
        observed, self._observed = self._observed, {}
        for (metric, *labels), amount in counts.items():
            metric.labels(*labels).inc(amount)
        for (histogram, *labels), tally in observed.items():
            add_observations(histogram.labels(*labels), tally[:-1], tally[-1])

    async def running(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(FOLD_INTERVAL_S, self._tick)

    def _tick(self) -> None:
        try:
            self.fold()
        finally:
            self._timer = asyncio.get_running_loop().call_later(FOLD_INTERVAL_S, self._tick)

    async def done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.fold()
