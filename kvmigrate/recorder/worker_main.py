"""The recorder's worker process itself (see kvmigrate.recorder.worker for the proxy's side).

Receive, convert and write, one step at a time, on whichever of two threads kvmigrate.pacer
gives the turn: an idle one while the work keeps up, a raised one while it is behind. With
a spool (`lane` set) the exchanges come from the lane's files, and the pipe only nudges;
without, they come through the pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kvmigrate.log_pipe import PipeHandler
from kvmigrate.pacer import Pacer
from kvmigrate.recorder.batches import Batches
from kvmigrate.recorder.convert import RecordConverter
from kvmigrate.recorder.crossing import SHARED_COUNTERS, WorkerSpec
from kvmigrate.recorder.spool import SpoolReader
from kvmigrate.recorder.spool_dir import LANE_LOCK, hold
from kvmigrate.recorder.writer import RecordWriter

# What one step reads and writes, raised or not: a step holds the turn (kvmigrate.pacer),
# and one at the lowest priority must end soon for the raised thread to take over.
READ_BYTES = 1 << 20
IDLE_READ_BYTES = 1  # one message
_MESSAGES_PER_STEP = 8
IDLE_FLUSH = 50  # records per write


def run_worker(
    conn: Connection,
    spec_state: tuple[Any, ...],
    shared: Any,
    logs: Connection,
    log_level: int,
    write_lock: str | None = None,
    lane: str | None = None,
) -> None:
    """The child's main: it ends when the proxy says so, after writing what it holds. Its
    work runs at the lowest priority, raised while it is behind (kvmigrate.pacer). When the
    proxy is gone, Linux ends it (kvmigrate.background); elsewhere a spooled worker exits at
    once (the proxy's next start writes its spool), and one without a spool writes what its
    pipe still holds, raised, then exits."""
    spec = WorkerSpec.from_state(spec_state)
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


def log_to(logs: Connection, log_level: int) -> None:
    """The package's log records go back to the proxy, through its handlers."""
    package_log = logging.getLogger("kvmigrate")
    package_log.handlers[:] = [PipeHandler(logs)]
    package_log.setLevel(log_level)
    package_log.propagate = False


def quiet_collector() -> None:
    # Records are acyclic: the cyclic collector would only rescan the memo and the answers
    # awaiting their shadow copies, over and over.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def open_writer(spec: WorkerSpec, source: str, write_lock: str | None) -> RecordWriter:
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
        write_lock=None if write_lock is None else _Turns(write_lock),
    )


def run_paced(worker: _PipeWorker | _SpoolWorker, shared: Any, orphaned: Any) -> None:
    urgent = SHARED_COUNTERS.index("urgent")
    raised = SHARED_COUNTERS.index("raised")

    def is_urgent() -> bool:
        return bool(shared[urgent]) or worker.parent_gone

    def orphan() -> None:
        worker.parent_gone = True
        orphaned()

    def count_raise() -> None:
        shared[raised] += 1

    pacer = Pacer(worker.work, worker.wait, worker.backlog_age, is_urgent, orphan, count_raise)
    try:
        pacer.run()
    finally:
        worker.finish()
        worker.batches.writer.stop()
        worker.batches.publish()


def _never() -> bool:
    return False


class _PipeWorker:
    """Exchanges through the pipe (record.durability: memory)."""

    def __init__(self, conn: Connection, batches: Batches) -> None:
        self.conn = conn
        self.batches = batches
        self.parent_gone = False
        self.ending = False  # told to stop, or the pipe closed: write what is left, and end

    def work(self, raised: bool, stop: Callable[[], bool]) -> bool:
        batches = self.batches
        for _ in range(_MESSAGES_PER_STEP if raised else 1):
            if batches.raw or self.ending:
                break  # what was taken is converted first
            try:
                if not self.conn.poll(0):
                    break
                message = self.conn.recv()
            except (EOFError, OSError):
                message = None
            if message is None:
                self.ending = True
            else:
                batches.take(message)
        batches.convert(_never if raised else stop)
        ending = self.ending and not batches.raw
        if batches.ready() or ending:
            batches.flush(None if raised or ending else IDLE_FLUSH)
        batches.writer.maintain_if_due()
        batches.publish()
        return not (ending and not batches.records)

    def wait(self, timeout: float) -> None:
        if self.batches.raw or self.ending:
            return
        with contextlib.suppress(EOFError, OSError):
            self.conn.poll(min(timeout, self.batches.wait_s()))

    def backlog_age(self) -> float:
        return 0.0  # what waits in the pipe is out of sight: raised only when urgent

    def orphaned(self) -> None:
        """The pipe's end follows: what it holds is written, raised (urgent)."""

    def finish(self) -> None:
        self.batches.convert(_never)
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
        batches.done = batches.written_to = reader.committed

    def work(self, raised: bool, stop: Callable[[], bool]) -> bool:
        if not self._hear():
            return False
        batches = self.batches
        if not batches.raw:
            frames = self.reader.read(READ_BYTES if raised else IDLE_READ_BYTES)
            for frame in frames:
                batches.take_frame(frame)
            self.more = bool(frames)
        batches.convert(_never if raised else stop)
        done = self.stopping and not self.more and not batches.raw
        flushing = batches.ready() or done
        if flushing and batches.flush(None if raised or done else IDLE_FLUSH):
            self.reader.commit(batches.written_to)
        batches.writer.maintain_if_due()
        batches.publish(self.reader.committed)
        return not (done and not batches.records)

    def _hear(self) -> bool:
        """Read the pipe: nudges, or the stop; False when the proxy is gone."""
        try:
            while self.conn.poll(0):
                message = self.conn.recv()
                if message is None:
                    self.stopping = True
                elif isinstance(message, list):  # exchanges the spool could not take
                    self.batches.take(message)
                else:
                    self.batches.shared[self.nudged] += 1
        except (EOFError, OSError):
            self.parent_gone = True
            return False
        return True

    def wait(self, timeout: float) -> None:
        if self.more or self.batches.raw:
            return
        with contextlib.suppress(EOFError, OSError):
            self.conn.poll(min(timeout, self.batches.wait_s()))

    def backlog_age(self) -> float:
        return self.reader.backlog_age(time.time())

    def finish(self) -> None:
        if not self.parent_gone:  # the proxy gone: its next start reads the spool again
            self.batches.convert(_never)
            if self.batches.flush():
                self.reader.commit(self.batches.written_to)
            self.batches.publish(self.reader.committed)  # the proxy removes a spool all acked


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


class _Turns:
    """The writers' lock: an exclusive `flock` of a file beside the database. The kernel
    drops it when its holder dies, so a worker killed while writing stops no other; and it
    is no named semaphore, which a process killed mid-drain would leave for the resource
    tracker to warn about at every pool shutdown."""

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
