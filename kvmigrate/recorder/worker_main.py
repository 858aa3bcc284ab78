"""The recorder's worker process itself (see kvmigrate.recorder.worker for the proxy's side).

Receive, convert and write, all on one thread: a second thread for the writes would only
trade the GIL back and forth.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import os
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from kvmigrate.log_pipe import PipeHandler
from kvmigrate.recorder.convert import RecordConverter
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.worker import SHARED_COUNTERS, Packed, WorkerSpec, unpack
from kvmigrate.recorder.writer import RecordWriter, WriterSettings


def run_worker(
    conn: Connection,
    spec: WorkerSpec,
    shared: Any,
    logs: Connection,
    log_level: int,
    write_lock: str | None = None,
) -> None:
    """The child's main: it ends when the proxy says so or goes away, after writing what
    it holds. It runs at the lowest priority (kvmigrate.background)."""
    package_log = logging.getLogger("kvmigrate")
    package_log.handlers[:] = [PipeHandler(logs)]
    package_log.setLevel(log_level)
    package_log.propagate = False
    # Records are acyclic: the cyclic collector would only rescan the memo and the answers
    # awaiting their shadow copies, over and over.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    from kvmigrate.recorder.store import open_store, pruner

    convert = RecordConverter(spec.content, spec.source, hash_key=spec.hash_key)
    writer = RecordWriter(
        lambda: open_store(spec.url),
        convert,
        spec.settings,
        maintain=pruner(spec.retention_days),
        on_write_error=convert.history.forget,
        write_lock=None if write_lock is None else _Turns(write_lock),
    )
    batches = _Batches(writer, spec.settings, shared)
    try:
        _receive(conn, batches)
    finally:
        batches.flush()
        writer.stop()
        batches.publish()


class _Batches:
    """Records waiting for their batch: written once `batch_size` are in, or when the
    oldest has waited `flush_interval`.

    Each message is converted as it arrives, not when its batch is full: a worker that
    stops reading its pipe for a whole batch's conversion blocks the proxy's
    feeder on that pipe, and with several workers the others then starve for it."""

    def __init__(self, writer: RecordWriter, settings: WriterSettings, shared: Any) -> None:
        self.writer = writer
        self.settings = settings
        self.shared = shared
        self.records: list[Record] = []
        self.deadline: float | None = None
        self.received = 0

    def add(self, packed: list[Packed]) -> None:
        self.received += len(packed)
        for item in packed:
            try:
                exchange = unpack(item)
            except Exception:
                self.writer.stats.drop("invalid")
                continue
            record = self.writer.convert(exchange)
            if record is not None:
                self.records.append(record)
        if self.deadline is None and self.records:
            self.deadline = time.monotonic() + self.settings.flush_interval
        if len(self.records) >= self.settings.batch_size:
            self.flush()

    def wait_s(self) -> float:
        if self.deadline is None:
            return 0.5
        return max(0.0, self.deadline - time.monotonic())

    def flush(self) -> None:
        if self.records:
            self.writer.write_records(self.records)
        self.records = []
        self.deadline = None

    def publish(self) -> None:
        """Counters into shared memory, where the proxy reads them (SHARED_COUNTERS)."""
        stats = self.writer.stats
        values = {
            "written": stats.written,
            "batches": stats.batches,
            "write_errors": stats.write_errors,
            "depth": len(self.records),
            "received": self.received,
            **{reason: stats.dropped.get(reason, 0) for reason in _DROPS},
        }
        for index, name in enumerate(SHARED_COUNTERS):
            self.shared[index] = values[name]


_DROPS = ("queue_full", "write_error", "invalid")


def _receive(conn: Connection, batches: _Batches) -> None:
    while True:
        try:
            ready = conn.poll(batches.wait_s())
            message = conn.recv() if ready else []
        except (EOFError, OSError):
            return  # the proxy is gone: write what we have and exit
        if message is None:
            return
        batches.add(message)
        if batches.deadline is not None and time.monotonic() >= batches.deadline:
            batches.flush()
        batches.writer.maintain_if_due()
        batches.publish()


class _Turns:
    """The writers' lock: an exclusive `flock` of a file beside the database. The kernel
    drops it when its holder dies, so a worker killed while writing stops no other."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if self._fd is None:
            os.makedirs(os.path.dirname(self._path) or ".", exist_ok=True)
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # woken as soon as it is free
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
