"""The cache-buster detector as a proxy addon: `exchange_done` only queues; a worker thread
parses, compares and counts, off the response path.

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
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from kvmigrate.cachecheck.compare import Tokenize, TurnCheck
from kvmigrate.cachecheck.fingerprint import FingerprintStore
from kvmigrate.cachecheck.tracker import ConversationTracker, tracking_key
from kvmigrate.wire.assemble import assemble

log = logging.getLogger("kvmigrate.cachecheck")

CHAT_ROUTE = "chat/completions"
RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


class ExchangeLike(Protocol):
    """What the addon reads of `kvmigrate.proxy.exchange.Exchange`."""

    request_id: str
    route: str
    role: str
    conversation: str
    turn: int
    request_body: bytes
    chunks: list[bytes]

    @property
    def ok(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class CacheCheckResult:
    """The verdict on one served request, for the recorder or anyone else to keep."""

    request_id: str
    conversation: str
    check: TurnCheck

    def as_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, **self.check.as_dict()}


class CacheBusterAddon:
    def __init__(
        self,
        max_conversations: int = 50_000,
        max_bytes: int = 256 << 20,
        ttl_s: float = 3600.0,
        queue_size: int = 10_000,
        keep_results: int = 1000,
        tokenize: Tokenize | None = None,
        on_result: Callable[[CacheCheckResult], None] | None = None,
    ) -> None:
        self.store = FingerprintStore(max_conversations, max_bytes, ttl_s)
        self._tracker = ConversationTracker(self.store, tokenize)
        # A SimpleQueue (C, lock-free put) bounded by hand: the event loop is its only
        # producer, so checking qsize() first is exact enough and costs far less than
        # queue.Queue's locks.
        self._queue: queue.SimpleQueue[ExchangeLike | None] = queue.SimpleQueue()
        self.queue_size = queue_size
        self._enqueued = 0  # written by the event loop only
        self._handled = 0  # written by the worker only
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
        registry.register(_StoreCollector(self.store))

    async def running(self) -> None:
        self.start()

    def exchange_done(self, exchange: ExchangeLike) -> None:
        # The response path: two attribute compares and a put_nowait, nothing else.
        if exchange.role != "serve" or exchange.route != CHAT_ROUTE:
            return
        if self._queue.qsize() >= self.queue_size:
            self.dropped.inc()
            return
        self._enqueued += 1
        self._queue.put_nowait(exchange)

    async def done(self) -> None:
        await asyncio.to_thread(self.close)

    # -- direct use -------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
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

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """True once every queued exchange is processed (for tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        while self._handled < self._enqueued:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    # -- the worker thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            exchange = self._queue.get()
            if exchange is None:
                return
            try:
                self._process(exchange)
            except Exception:
                # One odd request must not stop the checking of all the others.
                self.failed += 1
                log.exception(
                    "cachecheck: could not check %s", getattr(exchange, "request_id", "?")
                )
            finally:
                self._handled += 1

    def _process(self, exchange: ExchangeLike) -> None:
        if not exchange.ok:
            return  # a failed call is retried with the same prompt; it leaves no answer
        request = orjson.loads(exchange.request_body)
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            return
        response = assemble(exchange.route, b"".join(exchange.chunks))
        key = tracking_key(exchange.conversation, request)
        check = self._tracker.observe(key, request, response, time.monotonic(), exchange.turn)
        self.processed += 1
        if check.expected_tokens:
            self.reuse.observe(check.ratio)
        if check.brk is not None:
            self.breaks.labels(check.brk.cls.value).inc()
            self.tokens_lost.labels(check.brk.cls.value).inc(check.tokens_lost)
        result = CacheCheckResult(exchange.request_id, exchange.conversation, check)
        self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)


class _StoreCollector:
    """The store's size, read at scrape time."""

    def __init__(self, store: FingerprintStore) -> None:
        self._store = store

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "kvmigrate_cachecheck_conversations", "Conversations whose last prompt is tracked."
        )
        gauge.add_metric([], len(self._store))
        yield gauge
