"""The recorder's worker processes: parsing, redaction, parity and writing off the proxy's GIL.

Reassembling a streamed answer, redacting a history and scoring a pair cost more Python
per record than forwarding the request. On a thread of the proxy that work competes for
the GIL with the event loop, and under load every request's first chunk waited for it
(docs/performance-history.md). In a process of its own it runs on another core. What stays
in the proxy is a deque append on the response path, and a feeder thread that packs
batches of plain tuples (mostly bytes) for the workers.

How they cross (record.durability): appended to this process's spool (kvmigrate.recorder.
spool), which the workers read, so that a crash of the proxy or of a worker loses nothing
spooled: the next start replays what a dead process left (kvmigrate.recorder.replay); or,
`memory`, pickled into each worker's pipe, so that a `kill -9` of the proxy loses what was
not yet fed to the pipe and a dead worker what it held.

The children are started with `spawn`, never `fork`: the proxy has threads and an event
loop, and forking those is undefined. They ignore SIGINT (a Ctrl-C reaches the whole
process group; the proxy decides when the recorder stops).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kvmigrate.background import WorkerProcess
from kvmigrate.exchange import Exchange
from kvmigrate.log_pipe import LogRelay
from kvmigrate.recorder.crossing import SHARED_COUNTERS, Packed, WorkerSpec, pack
from kvmigrate.recorder.lanes import PipeLane, SpoolLane
from kvmigrate.recorder.spool_dir import ProcessSpool, SpoolSettings, others_in
from kvmigrate.recorder.tally import AnsweredTally
from kvmigrate.recorder.writer import WriterStats, describe

log = logging.getLogger("kvmigrate.recorder")

# Exchanges per message. Packing holds the GIL in one C call, so this bounds the event
# loop's stall as much as the message's size.
_MAX_MESSAGE = 32


class ProcessWriter:
    """The `RecordWriter` interface (submit, start, stop, stats, depth) over worker
    processes. Items are (exchange, wall-clock start) pairs; `submit` never blocks.
    `spool`: where this process spools what its workers have yet to write; None, through
    their pipes alone (record.durability: memory).

    With several workers each conversation goes to one of them, so a shadow copy meets the
    answer it copies and a history is stored by the worker that has seen it."""

    def __init__(
        self,
        spec: WorkerSpec,
        workers: int = 1,
        feed_interval: float = 0.02,
        spool: SpoolSettings | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.spec = spec
        self._workers = workers
        self._feed_interval = feed_interval
        self._context = multiprocessing.get_context("spawn")
        # The children's log records come back here and go through this process's handlers.
        # Nothing here is a named semaphore (a multiprocessing Queue or Lock): one left by
        # a process killed mid-drain made the resource tracker warn at every pool shutdown.
        self._logs = LogRelay()
        self._replay_log: Connection | None = None
        self._listening = False
        # Several workers writing one SQLite file (the replay is one, with a spool) take
        # turns on a lock of ours (see RecordWriter); PostgreSQL takes concurrent writers
        # as they come.
        several = workers > 1 or spool is not None
        self._lock = writers_lock_path(spec.url) if several else None
        self._settings = spool
        self._spool: ProcessSpool | None = None  # made at start
        self._lanes: list[PipeLane | SpoolLane] = []
        self._tally: AnsweredTally | None = None
        self._replayer: WorkerProcess | None = None
        self._replayed: Any = self._context.Array("q", len(SHARED_COUNTERS), lock=False)
        self._pending: deque[tuple[Exchange, float]] = deque()
        self._parent_drops = 0  # queue_full on this side; written by the event loop only
        self._dropped: deque[tuple[float, str]] = deque()  # ... when, and what role
        self._invalid = 0  # items that are not exchanges; written by the feeder only
        self._unwritten_at_stop = 0
        self._stopping = threading.Event()
        self._feeder: threading.Thread | None = None

    def submit(self, item: tuple[Exchange, float]) -> bool:
        if len(self._pending) >= self.spec.settings.queue_size:
            self._parent_drops += 1
            if self._tally is not None:  # an answer all the same (recorder.tally)
                self._dropped.append((item[1], getattr(item[0], "role", "")))
            return False
        self._pending.append(item)
        return True

    @property
    def depth(self) -> int:
        return len(self._pending) + sum(lane.depth for lane in self._lanes)

    @property
    def spool_path(self) -> Path | None:
        """This process's spool directory, once started with one."""
        return None if self._spool is None else self._spool.path

    @property
    def stats(self) -> WriterStats:
        def total(name: str) -> int:
            return sum(lane.count(name) for lane in self._lanes)

        stats = WriterStats(total("written"), total("batches"), total("write_errors"))
        drops = {
            "queue_full": total("queue_full") + self._parent_drops,
            "write_error": total("write_error") + self._replayed[_WRITE_ERROR],
            "invalid": total("invalid") + self._invalid,
            "worker_lost": sum(lane.lost for lane in self._lanes),
            "stop_timeout": self._unwritten_at_stop,
            "spool_full": sum(lane.full for lane in self._lanes),
        }
        for reason, count in drops.items():
            if count:
                stats.drop(reason, count)
        stats.replayed = int(self._replayed[_WRITTEN])
        stats.raised = total("raised")
        stats.unspooled = sum(getattr(lane, "unspooled", 0) for lane in self._lanes)
        return stats

    def start(self) -> None:
        if self._feeder is None:
            self._logs.start()
            self._listening = True
            self._open_lanes()
            for lane in self._lanes:
                lane.spawn()
            if self._replayer is not None:
                self._replayer.start()
            self._feeder = threading.Thread(
                target=self._feed, name="kvmigrate-recorder-feeder", daemon=True
            )
            self._feeder.start()

    def _open_lanes(self) -> None:
        """Spool lanes, and the replay of what dead processes left; pipe lanes without a
        spool, or when the spool's directory cannot be made (the proxy must serve)."""
        context, spec, logs, lock = self._context, self.spec, self._logs, self._lock
        settings = self._settings
        if settings is not None:
            try:
                self._spool = ProcessSpool(settings.root, spec.source, spec.url)
            except OSError as exc:
                log.error(
                    "recorder: cannot make the spool in %s (%s): records go to the workers "
                    "in memory only, and a crash loses what they hold",
                    settings.root,
                    exc,
                )
        if self._spool is None or settings is None:
            self._lanes = [PipeLane(context, spec, logs, lock) for _ in range(self._workers)]
            return
        share = max(1, settings.max_bytes // self._workers)
        self._lanes = [
            SpoolLane(context, spec, logs, lock, self._spool.lane(i), share, settings.sync)
            for i in range(self._workers)
        ]
        self._tally = AnsweredTally()
        root, own = str(settings.root), str(self._spool.path)
        if not others_in(settings.root, self._spool.path):
            return
        state, replayed = spec.state(), self._replayed
        self._replay_log = logs.new_pipe()
        replay_log = self._replay_log
        self._replayer = WorkerProcess(
            "kvmigrate-recorder-replay",
            "kvmigrate.recorder.replay:run_replay",
            lambda: (state, replayed, replay_log, log.getEffectiveLevel(), lock, root, own),
            raisable=True,
        )

    def stop(self, timeout: float = 30.0) -> None:
        """Feed what is queued, tell the workers to finish, and wait for them to."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._feeder is None:
            return
        for lane in self._lanes:
            lane.urge()
        self._feeder.join(timeout)
        finished = [lane.join(deadline) for lane in self._lanes]
        if self._replayer is not None:
            # A replay stopped part-way loses nothing: it acks as it goes.
            self._replayer.close(0.0)
        if self._spool is not None:
            self._close_spool(finished, timeout)
        elif not all(finished):
            # On a CPU that other work keeps busy a worker may not have read its pipe at
            # all, and its own depth says nothing of that.
            unwritten = len(self._pending) + sum(lane.unwritten for lane in self._lanes)
            self._unwritten_at_stop = unwritten
            log.error(
                "recorder: %d records not written: the workers did not finish within %g s "
                "(this machine's CPU is busy)",
                unwritten,
                timeout,
            )
            return
        for lane in self._lanes:
            lane.close_log_pipe()
        if self._replay_log is not None:
            self._replay_log.close()
        if self._listening:
            self._listening = False
            self._logs.stop()

    def _close_spool(self, finished: list[bool], timeout: float) -> None:
        """What the workers did not write in time stays in the spool, for the next start:
        not lost, so not counted as dropped."""
        assert self._spool is not None
        unwritten = len(self._pending) + sum(lane.unwritten for lane in self._lanes)
        for lane, done in zip(self._lanes, finished, strict=True):
            if not done:
                lane.kill()
            if isinstance(lane, SpoolLane):
                lane.close_spool()
        # A worker that died and was not started again (no traffic since) may have left a
        # finished lane unwritten: only acks say that a spool can go.
        caught_up = all(lane.caught_up for lane in self._lanes if isinstance(lane, SpoolLane))
        self._spool.release(written=all(finished) and caught_up and not self._pending)
        if not all(finished):
            log.warning(
                "recorder: about %d records not written within %g s stay in the spool %s: "
                "the next start of the proxy writes them",
                unwritten,
                timeout,
                self._spool.path,
            )

    def _feed(self) -> None:
        while True:
            stopping = self._stopping.wait(self._feed_interval)
            while self._pending:
                for lane, batch in zip(self._lanes, self._take(), strict=True):
                    if batch:
                        lane.send(batch)
            self._round_done()
            if stopping:
                for lane in self._lanes:
                    lane.finish()
                return

    def _round_done(self) -> None:
        """The answered counts that changed, into lane 0; each lane's commit and nudge."""
        if self._tally is None:
            return
        now = time.time()
        while self._dropped:
            self._tally.count(*self._dropped.popleft())
        rows = self._tally.changes(now)
        if rows and isinstance(lane := self._lanes[0], SpoolLane):
            lane.send_tally(rows)
        for each in self._lanes:
            each.fed(now)

    def _take(self) -> list[list[Packed]]:
        """Up to `_MAX_MESSAGE` exchanges, split by lane (a conversation keeps its lane)."""
        batches: list[list[Packed]] = [[] for _ in self._lanes]
        pending, lanes, tally = self._pending, len(self._lanes), self._tally
        for _ in range(min(len(pending), _MAX_MESSAGE)):
            item = pending.popleft()
            try:
                packed = pack(*item)
                batches[hash(item[0].grouping_key) % lanes if lanes > 1 else 0].append(packed)
            except Exception as exc:
                # By id and sizes only: the item holds the unredacted request and answer.
                log.debug("recorder: cannot pack %s (%s)", describe(item), type(exc).__name__)
                self._invalid += 1
                continue
            if tally is not None:
                tally.count(item[1], item[0].role)
        return batches


_WRITTEN = SHARED_COUNTERS.index("written")
_WRITE_ERROR = SHARED_COUNTERS.index("write_error")


def writers_lock_path(url: str) -> str | None:
    """The file several workers writing one SQLite file take turns on (a lock the kernel
    drops when its holder dies); None for a database that needs none."""
    if not url.startswith("sqlite"):
        return None
    from kvmigrate.recorder.sqlite_store import sqlite_path

    path = sqlite_path(url)
    return None if path == ":memory:" else path + "-kvmigrate-writers.lock"
