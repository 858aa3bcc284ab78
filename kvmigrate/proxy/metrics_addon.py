"""The addon that turns finished exchanges into Prometheus metrics, through the tally of
`ProxyMetrics` (`count`, `observe`), which it folds in every `FOLD_INTERVAL_S`."""

from __future__ import annotations

import asyncio

from kvmigrate.exchange import Exchange
from kvmigrate.policies.decode_speed import stream_speed
from kvmigrate.proxy.metrics import ProxyMetrics

FOLD_INTERVAL_S = 1.0


class MetricsAddon:
    def __init__(self, metrics: ProxyMetrics) -> None:
        self.metrics = metrics
        self._timer: asyncio.TimerHandle | None = None

    def exchange_done(self, exchange: Exchange) -> None:
        m = self.metrics
        backend, role, cohort = exchange.backend, exchange.role, exchange.cohort
        status = str(exchange.status) if exchange.status is not None else "none"
        m.count(m.requests, backend, role, exchange.route, status, cohort)
        if exchange.error is not None:
            m.count(m.errors, backend, role, exchange.error, cohort)
        elif exchange.status is not None and exchange.status >= 400:
            m.count(m.errors, backend, role, f"http_{exchange.status}", cohort)
        if (ttft := exchange.ttft) is not None:
            m.observe(m.ttft, ttft, backend, role, cohort)
        if (duration := exchange.duration) is not None:
            m.observe(m.latency, duration, backend, role, cohort)
        counts = exchange.token_counts()
        for kind, count in counts.items():
            m.count(m.tokens, backend, role, kind, amount=count)
        if (decode := exchange.decode_time) is not None:
            speed = stream_speed(
                counts.get("completion"),
                decode * 1000,
                exchange.later_chunks,
                exchange.max_chunk_gap * 1000,
            )
            if speed is not None:
                m.observe(m.decode_tps, speed.tokens_per_s, backend, role, cohort)
                m.observe(m.tpot, speed.tpot_ms / 1000, backend, role, cohort)
                m.observe(m.chunk_gap, exchange.max_chunk_gap, backend, role, cohort)

    async def running(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(FOLD_INTERVAL_S, self._tick)

    def _tick(self) -> None:
        try:
            self.metrics.fold()
        finally:
            self._timer = asyncio.get_running_loop().call_later(FOLD_INTERVAL_S, self._tick)

    async def done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.metrics.fold()
