"""The background writer: a bounded queue drained in batches by one thread.

A thread, not an asyncio task, because sqlite3 and psycopg block: their I/O must never
stall the proxy's event loop. The proxy side only ever calls `submit`, which never blocks.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.logtext import printable
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import AnsweredRow, RecordStore

log = logging.getLogger("kvmigrate.recorder")

_POLL_S = 0.1  # how often an idle writer looks at its stop flag


@dataclass
class WriterStats:
    """Each counter has a single writer thread (the proxy's loop or the writer), so plain
    integers suffice; readers may see a value one update old."""

    written: int = 0
    batches: int = 0
    write_errors: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    replayed: int = 0  # records written from the spools of proxy processes that died
    raised: int = 0  # times a worker that fell behind had its priority raised
    unspooled: int = 0  # records handed to a worker in memory, the spool not writable

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count


@dataclass(frozen=True, slots=True)
class WriterSettings:
    queue_size: int = 10_000
    batch_size: int = 500
    flush_interval: float = 0.2  # the longest a record waits for its batch to fill
    prune_every: float = 3600.0


def describe(item: object) -> str:
    """An item named for a log line by its request id and sizes: never its content, which
    is the unredacted request and answer. Items are (exchange, wall-clock start) pairs."""
    exchange = item[0] if isinstance(item, tuple) and item else item
    request_id = getattr(exchange, "request_id", None)
    if not isinstance(request_id, str):
        return f"an item of type {type(exchange).__name__}"
    body = getattr(exchange, "request_body", b"")
    chunks = getattr(exchange, "chunks", ())
    try:
        sizes = f"{len(body)} request bytes, {sum(len(c) for c in chunks)} answer bytes"
    except TypeError:  # not an Exchange after all: its sizes are not worth a crash
        sizes = "sizes unknown"
    # The id may be the client's own X-Request-ID: escaped, so it cannot forge a line.
    return f"the exchange of request {printable(request_id, 64)} ({sizes})"


class RecordWriter:
    """Converts queued items to records and writes them, off the caller's thread.

    `open_store` is called on the writer thread, and again after a failure to open, so a
    database that is down at start is picked up once it is back. `maintain` (pruning) runs
    on the same thread every `prune_every` seconds. `on_write_error` is told when a batch
    is dropped (the converter then forgets which history messages it has stored).
    `write_lock` is entered around each insert: writers of one SQLite file take turns on
    it, woken as soon as it is free, rather than in SQLite's busy handler, which retries
    after sleeps of up to 100 ms."""

    def __init__(
        self,
        open_store: Callable[[], RecordStore],
        convert: Callable[[Any], Record],
        settings: WriterSettings | None = None,
        maintain: Callable[[RecordStore], None] | None = None,
        on_write_error: Callable[[], None] | None = None,
        write_lock: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.settings = settings or WriterSettings()
        self._on_write_error = on_write_error
        self._write_lock = write_lock or contextlib.nullcontext
        self.stats = WriterStats()
        self._open_store = open_store
        self._convert = convert
        self._maintain = maintain
        self._queue: queue.Queue[Any] = queue.Queue(self.settings.queue_size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: RecordStore | None = None
        self._logged_error = False
        self._next_maintenance = 0.0

    def submit(self, item: Any) -> bool:
        """Queue an item; never blocks. A full queue drops it and counts the drop."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.stats.drop("queue_full")
            return False
        return True

    def put(self, item: Any) -> None:
        """Queue an item, waiting for room: for a producer that should slow down rather
        than drop (the worker process, whose own producer is the one that drops)."""
        self._queue.put(item)

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if self._thread is None:
            # Daemon: a proxy killed without `done()` must still be able to exit.
            self._thread = threading.Thread(
                target=self._run, name="kvmigrate-recorder", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop; blocks until done or `timeout`. Also closes the
        store of a writer that was driven by `write_batch` alone."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("recorder: %d records still queued at shutdown", self.depth)
        else:
            self._drain_now()
        alive = self._thread is not None and self._thread.is_alive()
        if self._store is not None and not alive:
            self._store.close()
            self._store = None

    def _drain_now(self) -> None:
        while (batch := self._collect()) is not None:
            self.write_batch(batch)

    def _run(self) -> None:
        while True:
            batch = self._collect()
            if batch is None:
                return
            if batch:
                self.write_batch(batch)
            self.maintain_if_due()

    def _collect(self) -> list[Any] | None:
        """The next batch; [] when idle; None once stopped and drained."""
        try:
            items = [self._queue.get(timeout=_POLL_S)]
        except queue.Empty:
            return None if self._stop.is_set() else []
        deadline = time.monotonic() + self.settings.flush_interval
        while len(items) < self.settings.batch_size:
            try:
                items.append(self._queue.get_nowait())
                continue
            except queue.Empty:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stop.is_set():
                break
            try:
                # Short waits, so a stop request cuts a long flush interval short.
                items.append(self._queue.get(timeout=min(remaining, _POLL_S)))
            except queue.Empty:
                continue
        return items

    def write_batch(self, items: Sequence[Any]) -> None:
        """Convert and write one batch now, on the caller's thread."""
        self.write_records([r for r in map(self.convert, items) if r is not None])

    def convert(self, item: Any) -> Record | None:
        """The record for one item; None (and a drop counted) for one that is not valid."""
        try:
            return self._convert(item)
        except Exception as exc:
            # Never the item itself, nor a traceback that may quote it: it holds the
            # unredacted request and answer.
            log.debug("recorder: cannot convert %s (%s)", describe(item), type(exc).__name__)
            self.stats.drop("invalid")
            return None

    def write_records(self, records: list[Record], answered: Sequence[AnsweredRow] = ()) -> None:
        """Write converted records, and `answered` totals (recorder.tally), in one
        transaction, now. A worker process converts each message as it arrives and writes in
        batches (kvmigrate.recorder.worker_main)."""
        try:
            self._insert(records, answered)
        except Exception as exc:
            # A full disk or a database that is down must never reach the proxy: count,
            # drop this batch, and say so once (a log line per batch would flood).
            self.stats.write_errors += 1
            self.stats.drop("write_error", len(records))
            self._log_error(exc)
            self._reset_store()
            if self._on_write_error is not None:
                self._on_write_error()
            return
        self.stats.written += len(records)
        self.stats.batches += bool(records)
        if self._logged_error:
            # The outage is over: say so, and let the next one be logged at error level
            # again (it was debug only, so a second outage dropped records in silence).
            self._logged_error = False
            log.info("recorder: writing records again")

    def _insert(self, records: list[Record], answered: Sequence[AnsweredRow] = ()) -> None:
        """One insert; a store kept open since an earlier batch gets a second try on a new
        connection: its server may have ended the idle one (a restart, a failover, a
        pooler's idle timeout), which each writer learnt only by losing a batch after the
        server was back. Retrying is safe: a batch lands whole or not at all, and a
        request id already stored is skipped."""
        reused = self._store is not None
        try:
            self._insert_once(records, answered)
        except Exception:
            if not reused:
                raise
            log.debug("recorder: a batch failed on a kept connection; retrying on a new one")
            self._reset_store()
            self._insert_once(records, answered)

    def _insert_once(self, records: list[Record], answered: Sequence[AnsweredRow]) -> None:
        store = self._store = self._store or self._open_store()
        with self._write_lock():
            store.insert(records, answered)

    def _log_error(self, exc: Exception) -> None:
        if self._logged_error:
            log.debug("recorder: write failed again: %s", exc)
            return
        self._logged_error = True
        log.error(
            "recorder: writing records failed (%s: %s); dropping batches until it recovers, "
            "see kvmigrate_recorder_write_errors_total",
            type(exc).__name__,
            exc,
        )

    def _reset_store(self) -> None:
        """Reopen on the next batch: a broken connection should not stay broken."""
        if self._store is not None:
            try:
                self._store.close()
            except Exception:
                log.debug("recorder: closing a failed store", exc_info=True)
            self._store = None

    def maintain_if_due(self) -> None:
        if self._maintain is None or time.monotonic() < self._next_maintenance:
            return
        self._next_maintenance = time.monotonic() + self.settings.prune_every
        try:
            store = self._store = self._store or self._open_store()
            self._maintain(store)
        except Exception as exc:
            self.stats.write_errors += 1
            self._log_error(exc)
            self._reset_store()
