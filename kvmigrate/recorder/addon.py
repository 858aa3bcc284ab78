"""The recorder as a proxy addon: `exchange_done` queues, a background thread writes."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from kvmigrate.config import Config
from kvmigrate.recorder.convert import CONTENT_POLICIES, ExchangeLike, to_record
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.redact import Redactor
from kvmigrate.recorder.store import RecordStore, open_store
from kvmigrate.recorder.writer import RecordWriter, WriterSettings, WriterStats

log = logging.getLogger("kvmigrate.recorder")

DAY_S = 86_400.0
# Answers kept until their shadow copies finish; beyond this the oldest go unscored.
MAX_MIRRORED = 2_000


class RecorderAddon:
    """Records every upstream call (serve and shadow) to a records database.

    On the response path `exchange_done` does two clock reads and a `put_nowait`; parsing
    the answer, redaction and I/O all happen on the writer thread."""

    def __init__(
        self,
        url: str,
        content: str = "redacted",
        retention_days: int | None = None,
        settings: WriterSettings | None = None,
        source: str | None = None,
    ) -> None:
        if content not in CONTENT_POLICIES:
            raise ValueError(f"content must be one of {CONTENT_POLICIES}, got {content!r}")
        self.url = url
        self.content = content
        self.retention_days = retention_days
        self.source = source or f"{socket.gethostname()}:{os.getpid()}"
        self._redactor = Redactor()  # used on the writer thread only
        # Written and evicted on the event loop only; the writer thread gets its own refs.
        self._mirrored: OrderedDict[str, ExchangeLike] = OrderedDict()
        self._writer = RecordWriter(
            lambda: open_store(url),
            self._convert,
            settings or WriterSettings(),
            maintain=self._prune if retention_days else None,
        )

    # -- addon events -----------------------------------------------------------------------

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(RecorderCollector(self._writer))

    async def running(self) -> None:
        self.start()

    def exchange_done(self, exchange: ExchangeLike) -> None:
        # The Exchange keeps monotonic times; the record needs the wall-clock start.
        ts = time.time() - (time.perf_counter() - exchange.started)
        mirrored = None
        if getattr(exchange, "mirrored", False):
            # Its shadow copy (and maybe a noise call) will follow: keep it to score them.
            self._mirrored[exchange.request_id] = exchange
            if len(self._mirrored) > MAX_MIRRORED:
                self._mirrored.popitem(last=False)
        elif exchange.pair_id is not None:
            mirrored = self._mirrored.get(exchange.pair_id)
        self._writer.submit((exchange, ts, mirrored))

    async def done(self) -> None:
        await asyncio.to_thread(self.close)

    # -- direct use (CLI, benchmarks, tests) ------------------------------------------------

    def start(self) -> None:
        self._writer.start()

    def close(self, timeout: float = 30.0) -> None:
        """Flush what is queued and stop the writer."""
        self._writer.stop(timeout)

    @property
    def stats(self) -> WriterStats:
        return self._writer.stats

    @property
    def queue_depth(self) -> int:
        return self._writer.depth

    def _convert(self, item: tuple[ExchangeLike, float, ExchangeLike | None]) -> Record:
        exchange, ts, mirrored = item
        return to_record(exchange, ts, self.content, self.source, self._redactor, mirrored)

    def _prune(self, store: RecordStore) -> None:
        assert self.retention_days is not None
        removed = store.prune(time.time() - self.retention_days * DAY_S)
        if removed:
            log.info("recorder: pruned %d records older than %d days", removed, self.retention_days)


class RecorderCollector:
    """Prometheus view of the writer's counters, read at scrape time (nothing on the hot
    path updates a Prometheus object)."""

    def __init__(self, writer: RecordWriter) -> None:
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
            "Records not written, by reason (queue_full, write_error, invalid).",
            labels=["reason"],
        )
        for reason in ("queue_full", "write_error", "invalid"):
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


def build_recorder(config: Config, **overrides: Any) -> RecorderAddon:
    """The recorder the config asks for (`record.db`, `record.content`, `retention_days`)."""
    record = config.record
    return RecorderAddon(
        record.db, record.content, retention_days=record.retention_days, **overrides
    )
