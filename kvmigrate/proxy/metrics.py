"""Prometheus metrics of one proxy, on a registry of its own (never the process-global one)."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from kvmigrate.proxy.pool_metrics import TrackingRegistry, pool_directory, render_pool
from kvmigrate.vendor_internals.prometheus_internals import add_observations, upper_bounds

# Agent turns range from a cached 40 ms prefill to minutes of decoding.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.35,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
# Decode speed of one stream: from a CPU build's few tokens per second to a small model's
# thousands on an idle GPU; the playbook's target is 50.
TPS_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0,
               500.0, 1000.0)  # fmt: skip
TPOT_BUCKETS = (0.001, 0.002, 0.004, 0.007, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2,
                0.5, 1.0)  # fmt: skip
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1)


class ProxyMetrics:
    """Counters and histograms labelled by backend and role (serve or shadow)."""

    def __init__(self) -> None:
        self.registry = TrackingRegistry()
        # What the response path counted since the last fold (see `count`, `fold`).
        self._counts: defaultdict[tuple[Any, ...], float] = defaultdict(float)
        self._observed: dict[tuple[Any, ...], _Tally] = {}
        self._other_folds: list[Callable[[], None]] = []
        r = self.registry
        self.requests = Counter(
            "kvmigrate_requests",
            "Upstream requests by backend, role, route, status and rollout cohort.",
            # `cohort` is a name from the config ("" for pass-through calls): bounded.
            ["backend", "role", "route", "status", "cohort"],
            registry=r,
        )
        self.errors = Counter(
            "kvmigrate_errors",
            "Failed upstream requests by backend, role, error class and rollout cohort.",
            ["backend", "role", "error", "cohort"],
            registry=r,
        )
        self.client_errors = Counter(
            "kvmigrate_client_errors",
            "Requests the proxy refused itself, by status.",
            ["status"],
            registry=r,
        )
        self.ttft = Histogram(
            "kvmigrate_ttft_seconds",
            "Time from the upstream call to its first body byte.",
            ["backend", "role", "cohort"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "kvmigrate_request_duration_seconds",
            "Time from the upstream call to its last byte.",
            ["backend", "role", "cohort"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Streams whose answer carried usage, after the first token (policies.decode_speed).
        self.decode_tps = Histogram(
            "kvmigrate_decode_tokens_per_second",
            "Output tokens per second of one stream after its first token.",
            ["backend", "role", "cohort"],
            buckets=TPS_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "kvmigrate_time_per_output_token_seconds",
            "Time per output token of one stream after its first token.",
            ["backend", "role", "cohort"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.chunk_gap = Histogram(
            "kvmigrate_stream_max_chunk_gap_seconds",
            "The longest wait between two relayed chunks of one stream.",
            ["backend", "role", "cohort"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.connections_closed = Counter(
            "kvmigrate_connections_closed",
            "Client connections the proxy closed itself, by reason (header_timeout: no "
            "whole request head in time; idle: a kept-alive connection sent no next request "
            "in time; over_limit: server.max_connections reached).",
            ["reason"],
            registry=r,
        )
        self.overhead = Histogram(
            "kvmigrate_overhead_seconds",
            "Time the proxy itself adds before relaying a response.",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "kvmigrate_tokens",
            "Tokens reported by upstream usage, by kind.",
            ["backend", "role", "kind"],
            registry=r,
        )
        self.shadow_dropped = Counter(
            "kvmigrate_shadow_dropped", "Shadow copies not sent, by reason.", ["reason"], registry=r
        )
        self.shadow_reseeded = Counter(
            "kvmigrate_shadow_reseeded",
            "Shadow copies of a chained Responses turn whose previous turn the candidate "
            "lacked (that copy dropped, failed or never sent), sent with the chain's context "
            "read back from the primary: the candidate's chain starts again there.",
            registry=r,
        )
        self.fallbacks = Counter(
            "kvmigrate_fallbacks",
            "Split-mode requests moved from the candidate to the primary.",
            ["reason"],
            registry=r,
        )
        self.stream_errors = Counter(
            "kvmigrate_stream_errors",
            "Streams that broke after bytes reached the client.",
            ["backend"],
            registry=r,
        )

        # Known label sets start at 0, so rate() and alerts work before the first event.
        # no_candidate_chain: a Responses copy whose chain the candidate does not hold.
        # key_unverified: the primary has not (yet) vouched for the client's key.
        for reason in (
            "concurrency_limit",
            "bytes_limit",
            "timeout",
            "error",
            "no_candidate_chain",
            "key_unverified",
        ):
            self.shadow_dropped.labels(reason)

    def gauge_function(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        """A gauge read at scrape time (with --workers, summed across the workers)."""
        self.registry.register(_GaugeFunction(name, documentation, read))

    # -- the response path's figures: tallied, then folded ------------------------------------

    def count(self, counter: Counter, *labels: str, amount: float = 1.0) -> None:
        """`counter.labels(*labels).inc(amount)`, at the next fold. Per exchange the metrics
        were a visible step of the event loop's time (a labelled child found, a lock per
        value, a histogram's buckets scanned; with `--workers`, a memory-mapped file written
        per value: benchmarks/critical_path.py times the steps); a tally takes a dict
        update."""
        self._counts[(counter, *labels)] += amount

    def observe(self, histogram: Histogram, value: float, *labels: str) -> None:
        """`histogram.labels(*labels).observe(value)` (no labels: the histogram itself), at
        the next fold."""
        key = (histogram, *labels)
        tally = self._observed.get(key)
        if tally is None:
            tally = self._observed[key] = _Tally(histogram)
        tally.add(value)

    def fold_also(self, fold: Callable[[], None]) -> None:
        """Run `fold` at every fold: another part's own tally, kept where it is counted."""
        self._other_folds.append(fold)

    def fold(self) -> None:
        """Add what was tallied since the last fold to the Prometheus metrics: before every
        scrape (`render`), and every `FOLD_INTERVAL_S` while the proxy runs (MetricsAddon),
        so that with `--workers` a scrape of another worker is at most that late."""
        counts, self._counts = self._counts, defaultdict(float)
        observed, self._observed = self._observed, {}
        for other in self._other_folds:
            other()
        for (counter, *labels), amount in counts.items():
            counter.labels(*labels).inc(amount)
        for (histogram, *labels), tally in observed.items():
            target = histogram.labels(*labels) if labels else histogram
            add_observations(target, tally.counts, tally.total)

    def render(self) -> bytes:
        self.fold()
        directory = pool_directory()
        if directory is not None:
            return render_pool(directory, self.registry.live)
        return generate_latest(self.registry)


class _Tally:
    """Observations of one histogram's child, counted per bucket and summed."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, histogram: Histogram) -> None:
        self.bounds: tuple[float, ...] = upper_bounds(histogram)  # +Inf last
        self.counts = [0.0] * len(self.bounds)
        self.total = 0.0

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value
        self.total += value


class _GaugeFunction:
    def __init__(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        self._name, self._documentation, self._read = name, documentation, read

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._documentation, value=self._read())
