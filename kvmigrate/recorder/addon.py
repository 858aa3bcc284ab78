"""The recorder as a proxy addon: `exchange_done` queues; a worker process (or, in-process,
a thread) parses, redacts, scores parity and writes."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from kvmigrate.config import Config
from kvmigrate.exchange import Exchange
from kvmigrate.recorder.convert import CONTENT_POLICIES, RecordConverter, new_hash_key
from kvmigrate.recorder.crossing import WorkerSpec
from kvmigrate.recorder.feedback_sink import FeedbackSink
from kvmigrate.recorder.spool_dir import SpoolSettings, spool_root
from kvmigrate.recorder.store import open_store, pruner
from kvmigrate.recorder.worker import ProcessWriter
from kvmigrate.recorder.writer import RecordWriter, WriterSettings, WriterStats

if TYPE_CHECKING:
    from kvmigrate.rollout.keys import StoreKeys

WORKERS = ("process", "thread")
DURABILITY = ("spool", "fsync", "memory")
DROP_REASONS = (
    "queue_full", "write_error", "invalid", "worker_lost", "stop_timeout", "spool_full",
)  # fmt: skip
# How long a stopping server's recorder writes before it leaves the rest in its spool, for
# the next start: within the pool's margin for the records (proxy.pool.RECORDS_MARGIN_S).
SPOOLED_STOP_S = 5.0
MB = 1 << 20


class Writer(Protocol):
    """What the addon needs of `RecordWriter` or `ProcessWriter`."""

    def submit(self, item: Any) -> bool: ...
    def start(self) -> None: ...
    def stop(self, timeout: float = 30.0) -> None: ...
    @property
    def stats(self) -> WriterStats: ...
    @property
    def depth(self) -> int: ...


class RecorderAddon:
    """Records every upstream call (serve, shadow and noise) to a records database.

    On the response path `exchange_done` does two clock reads and a deque append. With
    `worker="process"` (the default) everything else runs in `workers` child processes,
    on other cores and off the proxy's GIL; `worker="thread"` keeps it in this process (a
    CLI that records a few calls, or a platform where spawning is not allowed).

    `durability` (with process workers): `spool` appends each exchange to a spool file
    beside the records (or in `spool_dir`) before the workers write it, so a crash of the
    proxy or of a worker loses none that reached it, and the next start writes what a dead
    process left; `fsync` also syncs the spool to disk every 0.1 s, and each commit of the
    records, for a machine that crashes; `memory` hands exchanges to the workers through
    pipes alone (a crash loses what they hold). A thread writer holds them in memory."""

    def __init__(
        self,
        url: str,
        content: str = "redacted",
        retention_days: int | None = None,
        settings: WriterSettings | None = None,
        source: str | None = None,
        worker: str = "process",
        workers: int = 1,
        hash_key: bytes | None = None,
        durability: str = "spool",
        spool_dir: str = "",
        spool_max_mb: int = 256,
    ) -> None:
        if content not in CONTENT_POLICIES:
            raise ValueError(f"content must be one of {CONTENT_POLICIES}, got {content!r}")
        if worker not in WORKERS:
            raise ValueError(f"worker must be one of {WORKERS}, got {worker!r}")
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}, got {durability!r}")
        self.url = url
        self.content = content
        self.retention_days = retention_days
        self.source = source or f"{socket.gethostname()}:{os.getpid()}"
        settings = settings or WriterSettings()
        # Unset: a key of this recorder's own (ids match within its records only).
        self.hash_key = new_hash_key() if hash_key is None else hash_key
        hash_key = self.hash_key
        self._writer: Writer
        self._spooled = False
        if worker == "process":
            fsync = durability == "fsync"
            spec = WorkerSpec(url, content, self.source, retention_days, settings, hash_key, fsync)
            root = spool_root(url, spool_dir) if durability != "memory" else None
            spool = None if root is None else SpoolSettings(root, spool_max_mb * MB, fsync)
            self._spooled = spool is not None
            self._writer = ProcessWriter(spec, workers, spool=spool)
        else:
            convert = RecordConverter(content, self.source, hash_key=hash_key)
            self._writer = RecordWriter(
                lambda: open_store(url),
                convert,
                settings,
                maintain=pruner(retention_days),
                on_write_error=convert.history.forget,
            )

    # -- addon events -----------------------------------------------------------------------

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(RecorderCollector(self._writer))

    async def running(self) -> None:
        # Spawning the worker forks and execs: not something to do on the event loop.
        await asyncio.to_thread(self.start)

    def exchange_done(self, exchange: Exchange) -> None:
        # The Exchange keeps monotonic times; the record needs the wall-clock start.
        self._writer.submit((exchange, time.time() - (time.perf_counter() - exchange.started)))

    async def done(self) -> None:
        await asyncio.to_thread(self.close, self.stop_timeout)

    @property
    def stop_timeout(self) -> float:
        """How long a stopping server lets its recorder write. With a spool, what is not
        written in a few seconds is not lost: the next start writes it, and the server
        stops in time for its orchestrator's grace period."""
        return SPOOLED_STOP_S if self._spooled else 30.0

    def feedback_sink(self) -> FeedbackSink:
        """Where `POST /v1/feedback` stores scores: this recorder's database, its content
        policy and the key its ids are hashed with, so a score joins its records."""
        return FeedbackSink(self.url, self.content, self.hash_key, self.source)

    # -- direct use (CLI, benchmarks, tests) ------------------------------------------------

    def start(self) -> None:
        self._writer.start()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued and stop the writer."""
        self._writer.stop(timeout)

    @property
    def stats(self) -> WriterStats:
        return self._writer.stats

    @property
    def queue_depth(self) -> int:
        return self._writer.depth


class RecorderCollector:
    """Prometheus view of the writer's counters, read at scrape time (nothing on the hot
    path updates a Prometheus object)."""

    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        stats = self._writer.stats
        written = CounterMetricFamily(
            "kvmigrate_records_written", "Records written to the records database."
        )
        written.add_metric([], stats.written)
        yield written
        dropped = CounterMetricFamily(
            "kvmigrate_records_dropped",
            "Records not written, by reason (queue_full, write_error, invalid, worker_lost, "
            "stop_timeout, spool_full).",
            labels=["reason"],
        )
        for reason in DROP_REASONS:
            dropped.add_metric([reason], stats.dropped.get(reason, 0))
        yield dropped
        errors = CounterMetricFamily(
            "kvmigrate_recorder_write_errors", "Failed batch writes (each batch is dropped)."
        )
        errors.add_metric([], stats.write_errors)
        yield errors
        depth = GaugeMetricFamily(
            "kvmigrate_recorder_queue_depth", "Records waiting to be written (spooled or not)."
        )
        depth.add_metric([], self._writer.depth)
        yield depth
        replayed = CounterMetricFamily(
            "kvmigrate_records_replayed",
            "Records written from the spools of proxy processes that were gone (a crash).",
        )
        replayed.add_metric([], stats.replayed)
        yield replayed
        raised = CounterMetricFamily(
            "kvmigrate_recorder_raised",
            "Times a recorder worker fell a second behind and had its CPU priority raised.",
        )
        raised.add_metric([], stats.raised)
        yield raised
        unspooled = CounterMetricFamily(
            "kvmigrate_records_unspooled",
            "Records handed to a worker in memory because the spool could not be written (a "
            "full disk): a crash would lose them.",
        )
        unspooled.add_metric([], stats.unspooled)
        yield unspooled


def build_recorder(
    config: Config, keys: StoreKeys | None = None, **overrides: Any
) -> RecorderAddon:
    """The recorder the config asks for (`record.db`, `content`, `retention_days`, `workers`,
    `durability`, `spool_dir`, `spool_max_mb`).

    Conversation ids are hashed with `record.hash_key`, else with a key derived from the
    rollout store's secret (`keys`): the same for every proxy on the store and across
    restarts, and not in the records. Without a store, with a key of this process only."""
    record = config.record
    if record.hash_key is not None:
        key: bytes | None = record.hash_key.reveal().encode("utf-8", "surrogateescape")
    elif keys is not None:
        key = keys.records_key()
    else:
        key = None  # RecorderAddon makes one
    options: dict[str, Any] = {
        "retention_days": record.retention_days,
        "workers": record.workers,
        "hash_key": key,
        "durability": record.durability,
        "spool_dir": record.spool_dir,
        "spool_max_mb": record.spool_max_mb,
    }
    return RecorderAddon(record.db, record.content, **(options | overrides))
