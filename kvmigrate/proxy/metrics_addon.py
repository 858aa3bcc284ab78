"""The addon that turns finished exchanges into Prometheus metrics."""

from __future__ import annotations

from kvmigrate.exchange import Exchange
from kvmigrate.proxy.metrics import ProxyMetrics


class MetricsAddon:
    def __init__(self, metrics: ProxyMetrics) -> None:
        self.metrics = metrics

    def exchange_done(self, exchange: Exchange) -> None:
        m = self.metrics
        backend, role, cohort = exchange.backend, exchange.role, exchange.cohort
        status = str(exchange.status) if exchange.status is not None else "none"
        m.requests.labels(backend, role, exchange.route, status, cohort).inc()
        if exchange.error is not None:
            m.errors.labels(backend, role, exchange.error, cohort).inc()
        elif exchange.status is not None and exchange.status >= 400:
            m.errors.labels(backend, role, f"http_{exchange.status}", cohort).inc()
        if exchange.ttft is not None:
            m.ttft.labels(backend, role, cohort).observe(exchange.ttft)
        if exchange.duration is not None:
            m.latency.labels(backend, role, cohort).observe(exchange.duration)
        for kind, count in exchange.token_counts().items():
            m.tokens.labels(backend, role, kind).inc(count)
