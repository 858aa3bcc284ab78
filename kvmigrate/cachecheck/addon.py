"""The cache-buster detector as a proxy addon: `exchange_done` only queues; a worker
process (kvmigrate.cachecheck.process) parses, compares and fingerprints, off the proxy's
GIL, and a feeder thread counts its verdicts into the proxy's metrics.

Metrics (on the proxy's registry):
    kvmigrate_cache_breaks_total{class}        prefix breaks by cause
    kvmigrate_cache_tokens_lost_total{class}   tokens re-prefilled because of them
    kvmigrate_prefix_reuse_ratio               histogram: reused / what append-only would reuse
    kvmigrate_cachecheck_dropped_total         exchanges not checked (queue full)
    kvmigrate_cachecheck_conversations         conversations tracked now
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from kvmigrate.cachecheck.checker import (
    CHAT_ROUTE,
    CHECKED_ROUTES,
    CacheChecker,
    CacheCheckResult,
    CheckItem,
    StoreLimits,
)
from kvmigrate.cachecheck.compare import Tokenize
from kvmigrate.cachecheck.process import CheckerProcess, Failed, Outcome, WorkerGone, check_one
from kvmigrate.exchange import Exchange, Role
from kvmigrate.wire.chunk_log import MAX_RECORDED_BYTES

log = logging.getLogger("kvmigrate.cachecheck")

__all__ = ["CHAT_ROUTE", "CacheBusterAddon", "CacheCheckResult"]

RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
WORKERS = ("process", "thread")
_BATCH = 64  # exchanges per round trip to the worker process
_GATHER_S = 0.02  # how long a first exchange waits for others to join its batch


STOP_S = 1.0  # how long a stopping server waits for the detector's worker


class CacheBusterAddon:
    """`worker="process"` (the default) checks in a child process; `"thread"` on a thread
    of this one (simpler, for tests and one-off use: its parsing shares the GIL with the
    caller). A `tokenize` for the process must pickle (a module-level function)."""

    def __init__(
        self,
        max_conversations: int = 50_000,
        max_bytes: int = 256 << 20,
        ttl_s: float = 3600.0,
        queue_size: int = 10_000,
        keep_results: int = 1000,
        tokenize: Tokenize | None = None,
        on_result: Callable[[CacheCheckResult], None] | None = None,
        worker: str = "process",
    ) -> None:
        if worker not in WORKERS:
            raise ValueError(f"worker must be one of {WORKERS}, got {worker!r}")
        limits = StoreLimits(max_conversations, max_bytes, ttl_s)
        self._checker = CacheChecker(limits, tokenize) if worker == "thread" else None
        self._process = CheckerProcess(limits, tokenize) if worker == "process" else None
        self._tracked = 0  # conversations tracked, as the checker last said
        # A SimpleQueue (C, lock-free put) bounded by hand: the event loop is its only
        # producer, so checking qsize() first is exact enough and costs far less than
        # queue.Queue's locks.
        self._queue: queue.SimpleQueue[Exchange | None] = queue.SimpleQueue()
        self.queue_size = queue_size
        self._enqueued = 0  # written by the event loop only
        self._handled = 0  # written by the feeder only
        self.results: deque[CacheCheckResult] = deque(maxlen=keep_results)
        self.on_result = on_result
        self.processed = 0
        self.failed = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.breaks = Counter(
            "kvmigrate_cache_breaks", "Prefix-cache breaks by cause.", ["class"], registry=None
        )
        self.tokens_lost = Counter(
            "kvmigrate_cache_tokens_lost",
            "Prompt tokens re-prefilled because of prefix-cache breaks, by cause.",
            ["class"],
            registry=None,
        )
        self.reuse = Histogram(
            "kvmigrate_prefix_reuse_ratio",
            "Share of the previous turn plus its answer that a request reuses as its prefix.",
            buckets=RATIO_BUCKETS,
            registry=None,
        )
        self.dropped = Counter(
            "kvmigrate_cachecheck_dropped",
            "Exchanges not checked for cache busters because the queue was full.",
            registry=None,
        )

    # -- addon events -----------------------------------------------------------------------

    def register_metrics(self, registry: CollectorRegistry) -> None:
        for metric in (self.breaks, self.tokens_lost, self.reuse, self.dropped):
            registry.register(metric)
        registry.register(_TrackedCollector(lambda: self._tracked))

    async def running(self) -> None:
        self.start()

    def exchange_done(self, exchange: Exchange) -> None:
        # The response path: two attribute compares and a put_nowait, nothing else.
        if exchange.role != Role.SERVE or exchange.route not in CHECKED_ROUTES:
            return
        if self._queue.qsize() >= self.queue_size:
            self.dropped.inc()
            return
        self._enqueued += 1
        self._queue.put_nowait(exchange)

    async def done(self) -> None:
        # What is left unchecked at a stop is only this process's figures, gone with it: a
        # worker at the lowest priority on a busy machine must not hold the stop up.
        await asyncio.to_thread(self.close, STOP_S)

    # -- direct use -------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                if self._process is not None:
                    self._process.start()
                self._thread = threading.Thread(
                    target=self._run, name="kvmigrate-cachecheck", daemon=True
                )
                self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)
            if self._process is not None:
                self._process.close(timeout)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """True once every queued exchange is processed (for tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while self._handled < self._enqueued:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    # -- the feeder thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch, stopping = self._take()
            try:
                self._check_batch(batch)
            except Exception:  # whatever befalls one batch, the feeder goes on
                self.failed += len(batch)
                log.exception("cachecheck: %d exchanges not checked", len(batch))
            finally:
                self._handled += len(batch)
            if stopping:
                return

    def _take(self) -> tuple[list[Exchange], bool]:
        """(up to _BATCH exchanges, whether close() was called): waits for the first, then
        up to _GATHER_S for others to join it."""
        batch: list[Exchange] = []
        item = self._queue.get()
        if item is not None and self._queue.qsize() < _BATCH:
            # Let a batch gather: at low rates a wake per exchange put a GIL hand-over and
            # a round trip to the worker in the middle of the next request.
            time.sleep(_GATHER_S)
        while item is not None:
            batch.append(item)
            if len(batch) >= _BATCH:
                return batch, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False
        return batch, True

    def _check_batch(self, batch: list[Exchange]) -> None:
        items = []
        for exchange in batch:
            if len(exchange.request_body) > MAX_RECORDED_BYTES:
                # A pasted document, not an agent's growing prefix: copying 30 MB to the
                # worker to compare it costs more memory than the check is worth.
                continue
            try:
                items.append(_item(exchange))
            except Exception:
                self.failed += 1
                log.exception("cachecheck: not an exchange: %r", exchange)
        if not items:
            return
        try:
            outcomes = self._outcomes(items)
        except WorkerGone as exc:
            self.failed += len(items)
            log.error("cachecheck: %d exchanges not checked: %s", len(items), exc)
            return
        for item, outcome in zip(items, outcomes, strict=True):
            try:
                self._count(item, outcome)
            except Exception:  # an `on_result` that raises must not stop the feeder
                self.failed += 1
                log.exception("cachecheck: could not count %s", item.request_id)

    def _outcomes(self, items: list[CheckItem]) -> list[Outcome]:
        if self._process is not None:
            outcomes, self._tracked = self._process.check(items)
            return outcomes
        assert self._checker is not None
        outcomes = [check_one(self._checker, item) for item in items]
        self._tracked = len(self._checker.store)
        return outcomes

    def _count(self, item: CheckItem, outcome: Outcome) -> None:
        if isinstance(outcome, Failed):
            self.failed += 1
            log.error("cachecheck: could not check %s\n%s", item.request_id, outcome.message)
            return
        if outcome is None:
            return  # a failed call, or not a chat request
        self.processed += 1
        check = outcome.check
        if check.expected_tokens:
            self.reuse.observe(check.ratio)
        if check.brk is not None:
            self.breaks.labels(check.brk.cls.value).inc()
            self.tokens_lost.labels(check.brk.cls.value).inc(check.tokens_lost)
        self.results.append(outcome)
        if self.on_result is not None:
            self.on_result(outcome)


def _item(exchange: Exchange) -> CheckItem:
    return CheckItem(
        exchange.request_id,
        exchange.conversation,
        exchange.turn,
        exchange.ok,
        exchange.request_body,
        b"".join(exchange.chunks),
        exchange.route,
        exchange.identity,
    )


class _TrackedCollector:
    """How many conversations the checker tracks, read at scrape time."""

    def __init__(self, tracked: Callable[[], int]) -> None:
        self._tracked = tracked

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "kvmigrate_cachecheck_conversations", "Conversations whose last prompt is tracked."
        )
        gauge.add_metric([], self._tracked())
        yield gauge
