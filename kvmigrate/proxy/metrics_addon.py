"""The addon that turns finished exchanges into Prometheus metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from kvmigrate.exchange import Exchange
from kvmigrate.proxy.metrics import ProxyMetrics


class MetricsAddon:
    def __init__(self, metrics: ProxyMetrics) -> None:
        self.metrics = metrics
        # The labelled children, found once: `labels()` validates and locks on every call,
        # seven times per exchange.
        self._children: dict[tuple[object, ...], Any] = {}

    def _child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def exchange_done(self, exchange: Exchange) -> None:
        m, child = self.metrics, self._child
        backend, role, cohort = exchange.backend, exchange.role, exchange.cohort
        status = str(exchange.status) if exchange.status is not None else "none"
        child(m.requests, backend, role, exchange.route, status, cohort).inc()
        if exchange.error is not None:
            child(m.errors, backend, role, exchange.error, cohort).inc()
        elif exchange.status is not None and exchange.status >= 400:
            child(m.errors, backend, role, f"http_{exchange.status}", cohort).inc()
        if exchange.ttft is not None:
            child(m.ttft, backend, role, cohort).observe(exchange.ttft)
        if exchange.duration is not None:
            child(m.latency, backend, role, cohort).observe(exchange.duration)
        for kind, count in exchange.token_counts().items():
            child(m.tokens, backend, role, kind).inc(count)
