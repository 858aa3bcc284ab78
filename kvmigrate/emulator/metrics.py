"""Prometheus metrics of one emulator, in its own registry.

The vllm profile exposes the vLLM names and labels (`model_name`, `engine`) that dashboards
and the benchmark read; both profiles count injected faults in `emulator_faults_total`.
Prefix-cache queries and hits are counted in tokens, as vLLM v1 does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvmigrate.emulator.latency import PrefillEngine
from kvmigrate.emulator.settings import EmulatorSettings

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's own bucket boundaries, so histograms from the emulator and vLLM compare.
# fmt: off
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
_E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
# fmt: on
_LABELS = ("model_name", "engine")


class _VllmMetrics:
    def __init__(
        self, registry: CollectorRegistry, model: str, engine: PrefillEngine, capacity: int
    ) -> None:
        labels = {"model_name": model, "engine": "0"}
        self._labels = labels

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, _LABELS, registry=registry).labels(**labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(name, doc, _LABELS, registry=registry, buckets=buckets)
            return metric.labels(**labels)

        def gauge(name: str, doc: str, read: Callable[[], float]) -> None:
            Gauge(name, doc, _LABELS, registry=registry).labels(**labels).set_function(read)

        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            lambda: engine.running,
        )
        gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            lambda: engine.waiting,
        )
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            lambda: min(1.0, engine.kv_tokens / capacity) if capacity else 0.0,
        )
        self.prompt = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.cached = counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens.")
        self.queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*_LABELS, "finished_reason"),
            registry=registry,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _E2E_BUCKETS,
        )

    def finished(self, reason: str) -> None:
        self.success.labels(**self._labels, finished_reason=reason).inc()


class EmulatorMetrics:
    def __init__(self, settings: EmulatorSettings, engine: PrefillEngine) -> None:
        self.registry = CollectorRegistry()
        self._faults = Counter(
            "emulator_faults",
            "Faults injected by the emulator, by kind.",
            ("fault",),
            registry=self.registry,
        )
        self._vllm = None
        if settings.profile == "vllm":
            self._vllm = _VllmMetrics(
                self.registry, settings.served_models[0], engine, settings.cache_capacity_tokens
            )

    def faults(self, names: Iterable[str]) -> None:
        for name in names:
            self._faults.labels(fault=name).inc()

    def prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        if self._vllm is None:
            return
        self._vllm.prompt.inc(prompt_tokens)
        self._vllm.queries.inc(prompt_tokens)
        self._vllm.hits.inc(cached_tokens)
        self._vllm.cached.inc(cached_tokens)

    def first_token(self, ttft_s: float) -> None:
        if self._vllm is not None:
            self._vllm.ttft.observe(ttft_s)

    def finished(self, completion_tokens: int, reasons: Iterable[str], e2e_s: float) -> None:
        if self._vllm is None:
            return
        self._vllm.generation.inc(completion_tokens)
        self._vllm.e2e.observe(e2e_s)
        for reason in reasons:
            self._vllm.finished(reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)
