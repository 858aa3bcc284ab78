"""The recorder's worker process itself (see kvmigrate.recorder.worker for the proxy's side).

Receive, convert and write, one step at a time, on whichever of two threads kvmigrate.pacer
gives the turn: an idle one while the work keeps up, a raised one while it is behind. With
a spool (`lane` set) the exchanges come from the lane's files, and the pipe only nudges;
without, they come through the pipe.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import logging.handlers
import os
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec

from kvmigrate.pacer import Pacer
from kvmigrate.recorder.convert import RecordConverter
from kvmigrate.recorder.crossing import SHARED_COUNTERS, Packed, WorkerSpec, unpack
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.spool import EXCHANGES, TALLY, Frame, SpoolReader
from kvmigrate.recorder.spool_dir import LANE_LOCK, hold
from kvmigrate.recorder.store import AnsweredRow
from kvmigrate.recorder.writer import RecordWriter, WriterSettings

# What one step reads of a lane: the records of a few messages, so that a step, which holds
# the turn, stays short.
READ_BYTES = 1 << 20
_MESSAGES_PER_STEP = 8


def run_worker(
    conn: Connection,
    spec: WorkerSpec,
    shared: Any,
    logs: Any,
    log_level: int,
    write_lock: Any = None,
    lane: str | None = None,
) -> None:
    """The child's main: it ends when the proxy says so, after writing what it holds. Its
    work runs at the lowest priority, raised while it is behind (kvmigrate.pacer). When the
    proxy is gone, a spooled worker exits at once (the proxy's next start writes its spool);
    one without a spool writes what its pipe still holds, raised, then exits."""
    log_to(logs, log_level)
    quiet_collector()
    writer = open_writer(spec, spec.source, write_lock)
    batches = Batches(writer, spec.settings, shared, spec.source)
    if lane is None:
        piped = _PipeWorker(conn, batches)
        run_paced(piped, shared, orphaned=piped.orphaned)
        return
    with held(Path(lane) / LANE_LOCK):
        reader = SpoolReader(Path(lane))
        worker = _SpoolWorker(conn, batches, reader)
        try:
            run_paced(worker, shared, orphaned=lambda: os._exit(0))
        finally:
            reader.close()


def log_to(logs: Any, log_level: int) -> None:
    """The package's log records go back to the proxy, through its handlers."""
    package_log = logging.getLogger("kvmigrate")
    package_log.handlers[:] = [logging.handlers.QueueHandler(logs)]
    package_log.setLevel(log_level)
    package_log.propagate = False


def quiet_collector() -> None:
    # Records are acyclic: the cyclic collector would only rescan the memo and the answers
    # awaiting their shadow copies, over and over.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def open_writer(spec: WorkerSpec, source: str, write_lock: Any) -> RecordWriter:
    from kvmigrate.recorder.store import RecordStore, open_store, pruner

    def opened() -> RecordStore:
        store = open_store(spec.url)
        if spec.durable:
            store.sync_every_commit()
        return store

    convert = RecordConverter(spec.content, source, hash_key=spec.hash_key)
    return RecordWriter(
        opened,
        convert,
        spec.settings,
        maintain=pruner(spec.retention_days),
        on_write_error=convert.history.forget,
        write_lock=None if write_lock is None else lambda: _turn(write_lock),
    )


def run_paced(worker: _PipeWorker | _SpoolWorker, shared: Any, orphaned: Any) -> None:
    urgent = SHARED_COUNTERS.index("urgent")
    raised = SHARED_COUNTERS.index("raised")

    def is_urgent() -> bool:
        return bool(shared[urgent]) or worker.parent_gone

    def orphan() -> None:
        worker.parent_gone = True
        orphaned()

    pacer = Pacer(worker.work, worker.wait, worker.backlog_age, is_urgent, orphan)
    try:
        pacer.run()
    finally:
        worker.finish()
        worker.batches.writer.stop()
        shared[raised] = pacer.raised
        worker.batches.publish()


class Batches:
    """Records waiting for their batch: written once `batch_size` are in, or when the
    oldest has waited `flush_interval`; and the latest answered counts (recorder.tally),
    written with them.

    Each message is converted as it arrives, not when its batch is full: a worker that
    stops reading its pipe for a whole batch's conversion blocks the proxy's
    feeder on that pipe, and with several workers the others then starve for it."""

    def __init__(
        self, writer: RecordWriter, settings: WriterSettings, shared: Any, source: str
    ) -> None:
        self.writer = writer
        self.settings = settings
        self.shared = shared
        self.source = source
        self.records: list[Record] = []
        self.answered: dict[tuple[float, str], int] = {}
        self.deadline: float | None = None
        self.received = 0
        self.acked = 0  # items of frames whose records are written (spool)
        self.acked_offset = 0
        self.unacked = 0  # items read since the last flush

    def add(self, packed: list[Packed]) -> None:
        self.received += len(packed)
        self.unacked += len(packed)
        for item in packed:
            try:
                exchange = unpack(item)
            except Exception:
                self.writer.stats.drop("invalid")
                continue
            record = self.writer.convert(exchange)
            if record is not None:
                self.records.append(record)
        self._arm()

    def add_frame(self, frame: Frame) -> None:
        if frame.kind == EXCHANGES:
            try:
                packed = msgspec.msgpack.decode(frame.payload)
            except msgspec.DecodeError:
                self.writer.stats.drop("invalid", frame.items)
                return
            self.add(packed)
        elif frame.kind == TALLY:
            for bucket, role, count in msgspec.msgpack.decode(frame.payload):
                key = (bucket, role)
                self.answered[key] = max(count, self.answered.get(key, 0))
            self._arm()

    def _arm(self) -> None:
        if self.deadline is None and (self.records or self.answered or self.unacked):
            self.deadline = time.monotonic() + self.settings.flush_interval
        if len(self.records) >= self.settings.batch_size:
            self.flush()

    def due(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def wait_s(self) -> float:
        if self.deadline is None:
            return 0.5
        return max(0.0, self.deadline - time.monotonic())

    def flush(self) -> None:
        if self.records or self.answered:
            answered = [AnsweredRow(self.source, b, r, n) for (b, r), n in self.answered.items()]
            self.writer.write_records(self.records, answered)
        self.records = []
        self.answered = {}
        self.deadline = None
        self.acked += self.unacked
        self.unacked = 0

    def publish(self) -> None:
        """Counters into shared memory, where the proxy reads them (SHARED_COUNTERS)."""
        stats = self.writer.stats
        values = {
            "written": stats.written,
            "batches": stats.batches,
            "write_errors": stats.write_errors,
            "depth": len(self.records),
            "received": self.received,
            "acked": self.acked,
            **{reason: stats.dropped.get(reason, 0) for reason in _DROPS},
        }
        for name, value in values.items():
            self.shared[SHARED_COUNTERS.index(name)] = value
        if self.acked_offset:
            self.shared[SHARED_COUNTERS.index("acked_offset")] = self.acked_offset


_DROPS = ("queue_full", "write_error", "invalid")


class _PipeWorker:
    """Exchanges through the pipe (record.durability: memory)."""

    def __init__(self, conn: Connection, batches: Batches) -> None:
        self.conn = conn
        self.batches = batches
        self.parent_gone = False

    def work(self) -> bool:
        for _ in range(_MESSAGES_PER_STEP):
            try:
                if not self.conn.poll(0):
                    break
                message = self.conn.recv()
            except (EOFError, OSError):
                return False  # the proxy is gone: write what we have and exit
            if message is None:
                return False
            self.batches.add(message)
        if self.batches.due():
            self.batches.flush()
        self.batches.writer.maintain_if_due()
        self.batches.publish()
        return True

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(EOFError, OSError):
            self.conn.poll(min(timeout, self.batches.wait_s()))

    def backlog_age(self) -> float:
        return 0.0  # what waits in the pipe is out of sight: raised only when urgent

    def orphaned(self) -> None:
        """The pipe's end follows: what it holds is written, raised (urgent)."""

    def finish(self) -> None:
        self.batches.flush()


class _SpoolWorker:
    """Exchanges from the lane's spool files; the pipe brings nudges, and the stop."""

    def __init__(self, conn: Connection, batches: Batches, reader: SpoolReader) -> None:
        self.conn = conn
        self.batches = batches
        self.reader = reader
        self.parent_gone = False
        self.stopping = False
        self.more = True  # the last read filled its share: read again without waiting
        self.nudged = SHARED_COUNTERS.index("nudged")
        batches.acked_offset = reader.committed

    def work(self) -> bool:
        if not self._hear():
            return False
        frames = self.reader.read(READ_BYTES)
        for frame in frames:
            self.batches.add_frame(frame)
        self.more = bool(frames)
        done = self.stopping and not frames  # the feeder spooled everything before the stop
        if self.batches.due() or done:
            self._flush()
        self.batches.writer.maintain_if_due()
        self.batches.publish()
        return not done

    def _hear(self) -> bool:
        """Read the pipe: nudges, or the stop; False when the proxy is gone."""
        try:
            while self.conn.poll(0):
                if self.conn.recv() is None:
                    self.stopping = True
                else:
                    self.batches.shared[self.nudged] += 1
        except (EOFError, OSError):
            self.parent_gone = True
            return False
        return True

    def _flush(self) -> None:
        self.batches.flush()
        self.reader.commit(self.reader.position)
        self.batches.acked_offset = self.reader.committed

    def wait(self, timeout: float) -> None:
        if self.more:
            return
        with contextlib.suppress(EOFError, OSError):
            self.conn.poll(min(timeout, self.batches.wait_s()))

    def backlog_age(self) -> float:
        return self.reader.backlog_age(time.time())

    def finish(self) -> None:
        if not self.parent_gone:  # the proxy gone: its next start reads the spool again
            self._flush()


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """The lane's lock, for as long as this process reads it: a worker that died (or an
    orphan still exiting) lets go of it with its last breath."""
    fd = hold(path, wait_s=None)
    assert fd is not None
    try:
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _turn(lock: Any, timeout: float = 5.0) -> Iterator[None]:
    """Hold the writers' lock, or after `timeout` go ahead without it: a worker killed while
    holding it must not stop the others (SQLite's own locking still keeps the file whole)."""
    held = lock.acquire(timeout=timeout)
    try:
        yield
    finally:
        if held:
            lock.release()
