"""A recorder worker process and what the proxy's feeder thread hands it: through a spool
lane on disk (`SpoolLane`, record.durability spool or fsync), or through its pipe alone
(`PipeLane`, record.durability memory). Each lane's worker is started again if it dies."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from pathlib import Path
from typing import Any

import msgspec

from kvmigrate.background import WorkerGone, WorkerProcess
from kvmigrate.log_pipe import LogRelay
from kvmigrate.recorder.crossing import GAUGES, SHARED_COUNTERS, Packed, WorkerSpec
from kvmigrate.recorder.spool import EXCHANGES, TALLY, SpoolWriter

log = logging.getLogger("kvmigrate.recorder")

# A 1 MiB pipe instead of 64 KiB: a message of the feeder's most exchanges is about 300 KB.
_PIPE_BYTES = 1 << 20
# Group commit (record.durability: fsync): a lane's appended frames reach the disk at most
# this long after they were written.
SYNC_S = 0.1
# Nudges a worker may have unread in its pipe: one says "there is more in the spool"; a
# worker that is behind reads the spool anyway, and the pipe must never fill.
_NUDGES = 2


class Lane:
    """One worker process and its counters."""

    def __init__(
        self,
        context: SpawnContext,
        spec: WorkerSpec,
        logs: LogRelay,
        write_lock: str | None = None,
        directory: Path | None = None,
    ) -> None:
        self._shared = context.Array("q", len(SHARED_COUNTERS), lock=False)
        self._log_pipe: Connection | None = None  # this process's copy of the worker's end
        self._counted = [0] * len(SHARED_COUNTERS)  # what the workers gone before counted
        self.directory = directory
        # Exchanges dropped, written by the feeder only: lost with a worker that died (in a
        # pipe), or not spooled, the spool at its bound.
        self.lost = self.full = 0
        self._worker = WorkerProcess(
            "kvmigrate-recorder",
            # By name: the worker's main imports its module.
            "kvmigrate.recorder.worker_main:run_worker",
            self._args(spec, logs, write_lock),
            pipe_bytes=_PIPE_BYTES,
            on_start=self._carry_counts,
            raisable=True,
        )

    def _args(
        self, spec: WorkerSpec, logs: LogRelay, write_lock: str | None
    ) -> Callable[[], tuple[Any, ...]]:
        def args() -> tuple[Any, ...]:
            lane = None if self.directory is None else str(self.directory)
            level = log.getEffectiveLevel()
            self.close_log_pipe()  # the worker before has its own copy, or is gone
            self._log_pipe = logs.new_pipe()
            return (spec.state(), self._shared, self._log_pipe, level, write_lock, lane)

        return args

    def close_log_pipe(self) -> None:
        if self._log_pipe is not None:
            self._log_pipe.close()
            self._log_pipe = None

    def count(self, name: str) -> int:
        index = SHARED_COUNTERS.index(name)
        if name in GAUGES:
            return int(self._shared[index])
        return int(self._shared[index]) + self._counted[index]

    def _carry_counts(self) -> None:
        """A new worker counts from zero: keep what the last one had counted."""
        for index, name in enumerate(SHARED_COUNTERS):
            if name not in GAUGES:
                self._counted[index] += self._shared[index]
                self._shared[index] = 0
        self._shared[SHARED_COUNTERS.index("depth")] = 0

    def spawn(self) -> None:
        self._worker.start()

    def urge(self) -> None:
        """Finish at the raised priority: the proxy is stopping."""
        self._shared[SHARED_COUNTERS.index("urgent")] = 1

    def finish(self) -> None:
        self._worker.finish()

    def join(self, deadline: float) -> bool:
        """Wait for the worker to finish; False if it is still writing at `deadline`."""
        return self._worker.join(deadline - time.monotonic())

    def kill(self) -> None:
        self._worker.close(0.0)

    def _restart(self, reason: str) -> None:
        try:
            if self._worker.restart():
                log.error("recorder: %s; started it again", reason)
        except WorkerGone:
            # Out of processes or memory: the feeder must live on, and try again later.
            log.exception("recorder: cannot start a worker process; records wait or drop")


class PipeLane(Lane):
    """Exchanges through the pipe: what a worker that dies had not written is lost, and
    counted (`worker_lost`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent = 0  # into the pipe, to this lane's workers so far; written by the feeder only
        self._abandoned = 0  # of those, what a worker that died had not read

    def _carry_counts(self) -> None:
        """... and count as lost what the last one took with it, its pipe's contents and
        the records it held unwritten."""
        in_pipe = self._in_pipe()
        self._abandoned += in_pipe
        self.lost += in_pipe + self.count("depth")
        super()._carry_counts()

    def send(self, batch: list[Packed]) -> None:
        try:
            self._worker.send(batch)
            self.sent += len(batch)
        except WorkerGone as exc:
            self.lost += len(batch)
            self._restart(str(exc))

    def fed(self, now: float) -> None:
        """After each round of the feeder: nothing to do for a pipe."""

    @property
    def unwritten(self) -> int:
        """Sent but not received yet (still in the pipe), or received and not yet written."""
        return self._in_pipe() + self.count("depth")

    @property
    def depth(self) -> int:
        return self.count("depth")

    def _in_pipe(self) -> int:
        """Sent to the running worker and not read by it yet."""
        return self.sent - self.count("received") - self._abandoned


class SpoolLane(Lane):
    """Exchanges appended to the lane's spool; the pipe only nudges the worker. A worker
    that dies loses nothing: the next one starts where it last acked. `max_bytes`: what
    the lane may hold unwritten before new exchanges are dropped (`spool_full`)."""

    def __init__(
        self,
        context: SpawnContext,
        spec: WorkerSpec,
        logs: LogRelay,
        write_lock: str | None,
        directory: Path,
        max_bytes: int,
        sync: bool,
    ) -> None:
        super().__init__(context, spec, logs, write_lock, directory)
        assert self.directory is not None
        self._spool = SpoolWriter(self.directory, sync=sync)
        self._max_bytes = max_bytes
        self.spooled = 0  # exchanges appended; written by the feeder only
        self.unspooled = 0  # ... sent through the pipe instead, the spool not writable
        self._appended = False
        self._synced = 0.0
        self._nudges = 0
        self._failing = False

    def _carry_counts(self) -> None:
        super()._carry_counts()
        self._nudges = self.count("nudged")  # those sent to the last worker are gone with it

    def send(self, batch: list[Packed]) -> None:
        """Into the spool; when it cannot be written (a full disk), straight to the worker,
        as without a spool: the records store may well be elsewhere, and a crash would then
        lose only these (counted, `unspooled`)."""
        if self.append(EXCHANGES, msgspec.msgpack.encode(batch), len(batch)) is False:
            try:
                self._worker.send(batch)
                self.unspooled += len(batch)
            except WorkerGone as exc:
                self.lost += len(batch)
                self._restart(str(exc))

    def send_tally(self, rows: list[tuple[float, str, int]]) -> None:
        self.append(TALLY, msgspec.msgpack.encode(rows), 0)

    def append(self, kind: int, payload: bytes, items: int) -> bool | None:
        """Whether the frame is in the spool; None when the spool is full (its items are
        dropped, and counted)."""
        if self._spool.end - self.count("acked_offset") + len(payload) > self._max_bytes:
            self.full += items
            return None
        try:
            self._spool.append(kind, payload, items)
        except OSError as exc:
            if not self._failing:
                self._failing = True
                log.error("recorder: cannot write the spool %s (%s): records go to the "
                          "workers in memory until it can", self.directory, exc)  # fmt: skip
            return False
        if self._failing:
            self._failing = False
            log.info("recorder: writing the spool %s again", self.directory)
        self.spooled += items
        self._appended = True
        return True

    def fed(self, now: float) -> None:
        """After each round of the feeder: the group commit when due, and a nudge to the
        worker (started again if it died)."""
        if not self._appended:
            return
        self._appended = False
        if now - self._synced >= SYNC_S:
            self._synced = now
            try:
                self._spool.sync_now()
            except OSError as exc:
                log.error("recorder: cannot sync the spool %s (%s)", self.directory, exc)
        if not self._worker.running:
            self._restart("a recorder worker died")
        if self._nudges - self.count("nudged") < _NUDGES:
            try:
                self._worker.send(0)
                self._nudges += 1
            except WorkerGone:
                pass  # started again at the next round

    def close_spool(self) -> None:
        self._spool.close()

    @property
    def caught_up(self) -> bool:
        """Every frame appended is acked: written, or counted as dropped."""
        return self.count("acked_offset") >= self._spool.end

    @property
    def unwritten(self) -> int:
        return max(0, self.spooled + self.unspooled - self.count("acked"))

    @property
    def depth(self) -> int:
        return self.unwritten
