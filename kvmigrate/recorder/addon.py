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
from kvmigrate.recorder.store import open_store, pruner
from kvmigrate.recorder.worker import ProcessWriter, WorkerSpec
from kvmigrate.recorder.writer import RecordWriter, WriterSettings, WriterStats

if TYPE_CHECKING:
    from kvmigrate.rollout.keys import StoreKeys

WORKERS = ("process", "thread")
DROP_REASONS = ("queue_full", "write_error", "invalid", "worker_lost", "stop_timeout")


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
    CLI that records a few calls, or a platform where spawning is not allowed)."""

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
    ) -> None:
        if content not in CONTENT_POLICIES:
            raise ValueError(f"content must be one of {CONTENT_POLICIES}, got {content!r}")
        if worker not in WORKERS:
            raise ValueError(f"worker must be one of {WORKERS}, got {worker!r}")
        self.url = url
        self.content = content
        self.retention_days = retention_days
        self.source = source or f"{socket.gethostname()}:{os.getpid()}"
        settings = settings or WriterSettings()
        # Unset: a key of this recorder's own (ids match within its records only).
        self.hash_key = new_hash_key() if hash_key is None else hash_key
        hash_key = self.hash_key
        self._writer: Writer
        if worker == "process":
            spec = WorkerSpec(url, content, self.source, retention_days, settings, hash_key)
            self._writer = ProcessWriter(spec, workers)
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
        await asyncio.to_thread(self.close)

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
            "stop_timeout).",
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
            "kvmigrate_recorder_queue_depth", "Records waiting to be written."
        )
        depth.add_metric([], self._writer.depth)
        yield depth


def build_recorder(
    config: Config, keys: StoreKeys | None = None, **overrides: Any
) -> RecorderAddon:
    """The recorder the config asks for (`record.db`, `content`, `retention_days`, `workers`).

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
    }
    return RecorderAddon(record.db, record.content, **(options | overrides))
