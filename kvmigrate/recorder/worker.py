"""The recorder's worker process: parsing, redaction, parity and writing off the proxy's GIL.

Reassembling a streamed answer, redacting a history and scoring a pair cost more Python
per record than forwarding the request. On a thread of the proxy that work competes for
the GIL with the event loop, and under load every request's first chunk waited for it
(docs/performance-history.md). In a process of its own it runs on another core. What stays
in the proxy is a deque append on the response path, and a feeder thread that pickles
batches of plain tuples (mostly bytes) into a pipe.

The child is started with `spawn`, never `fork`: the proxy has threads and an event loop,
and forking those is undefined. It ignores SIGINT (a Ctrl-C reaches the whole process
group; the proxy decides when the recorder stops) and exits once its pipe says so or
closes, after writing what it holds: a `kill -9` of the proxy loses only the records not
yet fed into the pipe, at most `feed_interval` seconds of them.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from typing import Any

import orjson

from kvmigrate.background import WorkerGone, WorkerProcess
from kvmigrate.exchange import STATE_FIELDS, Exchange, exchange_from_state, exchange_scalars
from kvmigrate.log_pipe import LogRelay
from kvmigrate.recorder.convert import new_hash_key
from kvmigrate.recorder.writer import WriterSettings, WriterStats, describe
from kvmigrate.wire.chunk_log import MAX_RECORDED_BYTES

log = logging.getLogger("kvmigrate.recorder")

# Counters the child publishes into shared memory, in this order.
SHARED_COUNTERS = (
    "written", "batches", "write_errors", "queue_full", "write_error", "invalid", "depth",
    "received",
)  # fmt: skip
# Exchanges per pickled message. Pickling holds the GIL in one C call, so this bounds the
# event loop's stall as much as the message's size.
_MAX_MESSAGE = 32
# A 1 MiB pipe instead of 64 KiB: a message of `_MAX_MESSAGE` exchanges is about 300 KB.
_PIPE_BYTES = 1 << 20


Packed = tuple[Any, ...]  # an exchange's state (kvmigrate.exchange), then the wall-clock start


def pack(exchange: Exchange, ts: float) -> Packed:
    """The exchange as it crosses to a worker. A request body over `MAX_RECORDED_BYTES`
    crosses as a marker with its size, and so does an answer whose middle was not kept
    (`ChunkLog`), unless it is a stream: its head and its usage-bearing tail still count."""
    fields = exchange_scalars(exchange)
    body = exchange.request_body
    if len(body) > MAX_RECORDED_BYTES:
        fields = (*fields[:_BODY], not_recorded(len(body)), *fields[_BODY + 1 :])
    dropped = getattr(exchange.chunks, "dropped", 0)
    answer = b"".join(exchange.chunks)
    if dropped and not exchange.stream:
        answer = not_recorded(len(answer) + dropped)
    return (*fields, [answer], ts)


def not_recorded(size: int) -> bytes:
    """What the record holds in place of a body too large to keep."""
    return orjson.dumps({"kvmigrate_not_recorded": {"bytes": size}})


_BODY = STATE_FIELDS.index("request_body")


def unpack(packed: Packed) -> tuple[Exchange, float]:
    return exchange_from_state(packed[:-1]), packed[-1]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything the child needs to build its writer; picklable."""

    url: str
    content: str
    source: str
    retention_days: int | None
    settings: WriterSettings
    # What conversation ids are hashed with: one key for every worker of the recorder.
    hash_key: bytes = field(default_factory=new_hash_key)


class ProcessWriter:
    """The `RecordWriter` interface (submit, start, stop, stats, depth) over worker
    processes. Items are (exchange, wall-clock start) pairs; `submit` never blocks.

    With several workers each conversation goes to one of them, so a shadow copy meets the
    answer it mirrors and a history is stored by the worker that has seen it."""

    def __init__(self, spec: WorkerSpec, workers: int = 1, feed_interval: float = 0.02) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.spec = spec
        self._feed_interval = feed_interval
        context = multiprocessing.get_context("spawn")
        # The children's log records come back here and go through this process's handlers.
        # Nothing here is a named semaphore (a multiprocessing Queue or Lock): one left by
        # a process killed mid-drain made the resource tracker warn at every pool shutdown.
        self._logs = LogRelay()
        self._listening = False
        # Several workers writing one SQLite file take turns on a lock of ours (see
        # RecordWriter); PostgreSQL takes concurrent writers as they come.
        lock = writers_lock_path(spec.url) if workers > 1 else None
        self._lanes = [_Lane(context, spec, self._logs, lock) for _ in range(workers)]
        self._pending: deque[tuple[Exchange, float]] = deque()
        self._parent_drops = 0  # queue_full on this side; written by the event loop only
        self._invalid = 0  # items that are not exchanges; written by the feeder only
        self._unwritten_at_stop = 0
        self._stopping = threading.Event()
        self._feeder: threading.Thread | None = None

    def submit(self, item: tuple[Exchange, float]) -> bool:
        if len(self._pending) >= self.spec.settings.queue_size:
            self._parent_drops += 1
            return False
        self._pending.append(item)
        return True

    @property
    def depth(self) -> int:
        return len(self._pending) + sum(lane.count("depth") for lane in self._lanes)

    @property
    def stats(self) -> WriterStats:
        def total(name: str) -> int:
            return sum(lane.count(name) for lane in self._lanes)

        stats = WriterStats(total("written"), total("batches"), total("write_errors"))
        drops = {
            "queue_full": total("queue_full") + self._parent_drops,
            "write_error": total("write_error"),
            "invalid": total("invalid") + self._invalid,
            "worker_lost": sum(lane.lost for lane in self._lanes),
            "stop_timeout": self._unwritten_at_stop,
        }
        for reason, count in drops.items():
            if count:
                stats.drop(reason, count)
        return stats

    def start(self) -> None:
        if self._feeder is None:
            self._logs.start()
            self._listening = True
            for lane in self._lanes:
                lane.spawn()
            self._feeder = threading.Thread(
                target=self._feed, name="kvmigrate-recorder-feeder", daemon=True
            )
            self._feeder.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Feed what is queued, tell the workers to finish, and wait for them to."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._feeder is None:
            return
        self._feeder.join(timeout)
        finished = [lane.join(deadline) for lane in self._lanes]
        if not all(finished):
            # A worker runs at the lowest priority: on a CPU that other work keeps busy it
            # may not have read its pipe at all, and its own depth says nothing of that.
            unwritten = len(self._pending) + sum(lane.unwritten for lane in self._lanes)
            self._unwritten_at_stop = unwritten
            log.error(
                "recorder: %d records not written: the workers did not finish within %g s "
                "(they run at the lowest CPU priority, and this machine's CPU is busy)",
                unwritten,
                timeout,
            )
            return
        for lane in self._lanes:
            lane.close_log_pipe()
        if self._listening:
            self._listening = False
            self._logs.stop()

    def _feed(self) -> None:
        while True:
            stopping = self._stopping.wait(self._feed_interval)
            while self._pending:
                for lane, batch in zip(self._lanes, self._take(), strict=True):
                    if batch:
                        lane.send(batch)
            if stopping:
                for lane in self._lanes:
                    lane.send(None)
                return

    def _take(self) -> list[list[Packed]]:
        """Up to `_MAX_MESSAGE` exchanges, split by lane (a conversation keeps its lane)."""
        batches: list[list[Packed]] = [[] for _ in self._lanes]
        pending, lanes = self._pending, len(self._lanes)
        for _ in range(min(len(pending), _MAX_MESSAGE)):
            item = pending.popleft()
            try:
                packed = pack(*item)
                batches[hash(item[0].grouping_key) % lanes if lanes > 1 else 0].append(packed)
            except Exception as exc:
                # By id and sizes only: the item holds the unredacted request and answer.
                log.debug("recorder: cannot pack %s (%s)", describe(item), type(exc).__name__)
                self._invalid += 1
        return batches


class _Lane:
    """One worker process and its counters (the process started again if it dies)."""

    def __init__(
        self, context: SpawnContext, spec: WorkerSpec, logs: LogRelay, write_lock: str | None
    ) -> None:
        self._shared = context.Array("q", len(SHARED_COUNTERS), lock=False)
        self._logs = logs
        self._log_pipe: Connection | None = None  # this process's copy of the worker's end
        self._counted = [0] * len(SHARED_COUNTERS)  # what the workers gone before counted
        self.lost = 0  # what a worker that died took with it; written by the feeder only
        self.sent = 0  # into the pipe, to this lane's workers so far; written by the feeder only
        self._abandoned = 0  # of those, what a worker that died had not read
        self._worker = WorkerProcess(
            "kvmigrate-recorder",
            # By name: the worker's main imports this module.
            "kvmigrate.recorder.worker_main:run_worker",
            lambda: (spec, self._shared, self._new_log_pipe(), log.getEffectiveLevel(), write_lock),
            pipe_bytes=_PIPE_BYTES,
            on_start=self._carry_counts,
        )

    def _new_log_pipe(self) -> Connection:
        self.close_log_pipe()  # the worker before has its own copy, or is gone
        self._log_pipe = self._logs.new_pipe()
        return self._log_pipe

    def close_log_pipe(self) -> None:
        if self._log_pipe is not None:
            self._log_pipe.close()
            self._log_pipe = None

    def count(self, name: str) -> int:
        index = SHARED_COUNTERS.index(name)
        if name == "depth":
            return int(self._shared[index])
        return int(self._shared[index]) + self._counted[index]

    def _carry_counts(self) -> None:
        """A new worker counts from zero: keep what the last one had counted, and count as
        lost what it took with it, its pipe's contents and the records it held unwritten."""
        in_pipe = self._in_pipe()
        self._abandoned += in_pipe
        self.lost += in_pipe + self.count("depth")
        for index, name in enumerate(SHARED_COUNTERS):
            if name != "depth":
                self._counted[index] += self._shared[index]
            self._shared[index] = 0

    def spawn(self) -> None:
        self._worker.start()

    def send(self, batch: list[Packed] | None) -> None:
        if batch is None:
            self._worker.finish()
            return
        try:
            self._worker.send(batch)
            self.sent += len(batch)
        except WorkerGone as exc:
            self.lost += len(batch)
            try:
                if self._worker.restart():
                    log.error("recorder: %s; started it again", exc)
            except WorkerGone:
                # Out of processes or memory: the feeder must live on, and try again later.
                log.exception("recorder: cannot start a worker process; records are dropped")

    @property
    def unwritten(self) -> int:
        """Sent but not received yet (still in the pipe), or received and not yet written."""
        return self._in_pipe() + self.count("depth")

    def _in_pipe(self) -> int:
        """Sent to the running worker and not read by it yet."""
        return self.sent - self.count("received") - self._abandoned

    def join(self, deadline: float) -> bool:
        """Wait for the worker to finish; False if it is still writing at `deadline`."""
        return self._worker.join(deadline - time.monotonic())


def writers_lock_path(url: str) -> str | None:
    """The file several workers writing one SQLite file take turns on (a lock the kernel
    drops when its holder dies); None for a database that needs none."""
    if not url.startswith("sqlite"):
        return None
    from kvmigrate.recorder.sqlite_store import sqlite_path

    path = sqlite_path(url)
    return None if path == ":memory:" else path + "-kvmigrate-writers.lock"
