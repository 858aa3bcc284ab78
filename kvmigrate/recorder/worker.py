"""The recorder's worker process: parsing, redaction, parity and writing off the proxy's GIL.

Reassembling a streamed answer, redacting a history and scoring a pair cost about 100 µs of
Python per record. On a thread of the proxy that work competes for the GIL with the event
loop, and under load the proxy slowed (added TTFC at concurrency 64 went from about 5 ms
to 62 ms with the recorder on). In a process of its own it runs on another core. What stays
in the proxy is a deque append on the response path, and a feeder thread that pickles
batches of plain tuples (mostly bytes) into a pipe.

The child is started with `spawn`, never `fork`: the proxy has threads and an event loop,
and forking those is undefined. It ignores SIGINT (a Ctrl-C reaches the whole process
group; the proxy decides when the recorder stops) and exits once its pipe says so or
closes, after writing what it holds: a `kill -9` of the proxy loses only the records not
yet fed into the pipe, at most `feed_interval` seconds of them.
"""

from __future__ import annotations

import gc
import logging
import logging.handlers
import multiprocessing
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from operator import attrgetter
from typing import Any, NamedTuple

from kvmigrate.recorder.convert import ExchangeLike, RecordConverter
from kvmigrate.recorder.writer import RecordWriter, WriterSettings, WriterStats

log = logging.getLogger("kvmigrate.recorder")

# Counters the child publishes into shared memory, in this order.
_SHARED = ("written", "batches", "write_errors", "queue_full", "write_error", "invalid", "depth")
# Exchanges per pickled message. Pickling holds the GIL in one C call, so this bounds the
# event loop's stall (about 10 µs an exchange) as much as the message's size.
_MAX_MESSAGE = 64
_RESPAWN_S = 1.0  # the least time between two starts of a worker that keeps dying


class RecordedExchange(NamedTuple):
    """What the worker needs of a finished `Exchange`, the answer's chunks joined into one
    bytes object. It crosses the pipe as a plain tuple, which pickles faster."""

    request_id: str
    route: str
    backend: str
    role: str
    model: str
    served_model: str
    conversation: str
    turn: int
    stream: bool
    started: float
    request_body: bytes
    status: int | None
    error: str | None
    first_byte: float | None
    finished: float | None
    fallback_from: str | None
    pair_id: str | None
    mirrored: bool
    chunks: list[bytes]


_FIELDS = attrgetter(*RecordedExchange._fields[:-1])


Packed = tuple[Any, ...]  # RecordedExchange's fields, then the wall-clock start


def pack(exchange: ExchangeLike, ts: float) -> Packed:
    return (*_FIELDS(exchange), [b"".join(exchange.chunks)], ts)


def unpack(packed: Packed) -> tuple[RecordedExchange, float]:
    return RecordedExchange._make(packed[:-1]), packed[-1]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything the child needs to build its writer; picklable."""

    url: str
    content: str
    source: str
    retention_days: int | None
    settings: WriterSettings


class ProcessWriter:
    """The `RecordWriter` interface (submit, start, stop, stats, depth) over a worker
    process. Items are (exchange, wall-clock start) pairs; `submit` never blocks."""

    def __init__(
        self,
        spec: WorkerSpec,
        maintain: Callable[[Any], None] | None = None,
        feed_interval: float = 0.02,
    ) -> None:
        self.spec = spec
        self._feed_interval = feed_interval
        self._maintain = maintain
        self._context = multiprocessing.get_context("spawn")
        self._shared = self._context.Array("q", len(_SHARED), lock=False)
        self._pending: deque[tuple[ExchangeLike, float]] = deque()
        self._parent_drops = 0  # queue_full on this side; written by the event loop only
        self._lost = 0  # sent into a pipe whose worker died; written by the feeder only
        self._invalid = 0  # items that are not exchanges; written by the feeder only
        self._counted = [0] * len(_SHARED)  # what workers that are gone had counted
        # The child's log records come back here and go through this process's handlers.
        self._logs: Any = self._context.Queue()
        self._log_listener = logging.handlers.QueueListener(self._logs, _Relay())
        self._listening = False
        self._stopping = threading.Event()
        self._feeder: threading.Thread | None = None
        self._process: SpawnProcess | None = None
        self._conn: Connection | None = None
        self._last_spawn = 0.0

    def submit(self, item: tuple[ExchangeLike, float]) -> bool:
        if len(self._pending) >= self.spec.settings.queue_size:
            self._parent_drops += 1
            return False
        self._pending.append(item)
        return True

    @property
    def depth(self) -> int:
        return len(self._pending) + int(self._shared[_SHARED.index("depth")])

    @property
    def stats(self) -> WriterStats:
        counts = [now + before for now, before in zip(self._shared, self._counted, strict=True)]
        shared = dict(zip(_SHARED, counts, strict=True))
        stats = WriterStats(shared["written"], shared["batches"], shared["write_errors"])
        drops = {
            "queue_full": shared["queue_full"] + self._parent_drops,
            "write_error": shared["write_error"],
            "invalid": shared["invalid"] + self._invalid,
            "worker_lost": self._lost,
        }
        for reason, count in drops.items():
            if count:
                stats.drop(reason, count)
        return stats

    def start(self) -> None:
        if self._feeder is None:
            self._log_listener.start()
            self._listening = True
            self._spawn()
            self._feeder = threading.Thread(
                target=self._feed, name="kvmigrate-recorder-feeder", daemon=True
            )
            self._feeder.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Feed what is queued, tell the worker to finish, and wait for it to."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._feeder is None:
            return
        self._feeder.join(timeout)
        if self._process is not None:
            self._process.join(max(0.0, deadline - time.monotonic()))
            if self._process.is_alive():
                log.warning("recorder: the worker is still writing %d records", self.depth)
                return
        if self._conn is not None:
            self._conn.close()
        if self._listening:
            self._listening = False
            self._log_listener.stop()

    def _spawn(self) -> None:
        # A new worker counts from zero: keep what the last one had counted.
        for index, name in enumerate(_SHARED):
            if name != "depth":
                self._counted[index] += self._shared[index]
            self._shared[index] = 0
        self._last_spawn = time.monotonic()
        receiver, sender = self._context.Pipe(duplex=False)
        self._process = self._context.Process(
            target=run_worker,
            args=(self.spec, receiver, self._shared, self._logs, log.getEffectiveLevel()),
            name="kvmigrate-recorder",
            daemon=True,  # a proxy that exits without `done()` must not wait for it
        )
        self._process.start()
        receiver.close()  # the child holds its own copy; ours would hide its EOF
        self._conn = sender

    def _feed(self) -> None:
        while True:
            stopping = self._stopping.wait(self._feed_interval)
            while self._pending:
                self._send(self._take())
            if stopping:
                self._send(None)
                return

    def _take(self) -> list[Packed]:
        batch: list[Packed] = []
        pending = self._pending
        while pending and len(batch) < _MAX_MESSAGE:
            item = pending.popleft()
            try:
                batch.append(pack(*item))
            except Exception:
                log.debug("recorder: not an exchange: %r", item, exc_info=True)
                self._invalid += 1
        return batch

    def _send(self, batch: list[Packed] | None) -> None:
        try:
            if self._conn is None or self._process is None or not self._process.is_alive():
                raise BrokenPipeError("the recorder worker is not running")
            self._conn.send(batch)
        except (OSError, ValueError) as exc:
            if batch is None:
                return  # stopping anyway
            self._lost += len(batch)
            if time.monotonic() - self._last_spawn >= _RESPAWN_S:
                log.error("recorder: the worker process is gone (%s); restarting it", exc)
                self._spawn()


class _Relay(logging.Handler):
    """Hands a record from the worker to this process's logger of the same name."""

    def handle(self, record: logging.LogRecord) -> bool:
        logging.getLogger(record.name).handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)


def run_worker(spec: WorkerSpec, conn: Connection, shared: Any, logs: Any, log_level: int) -> None:
    """The child's main: receive, convert and write, all on one thread (a second thread
    for the writes would only trade the GIL back and forth)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    package_log = logging.getLogger("kvmigrate")
    package_log.handlers[:] = [logging.handlers.QueueHandler(logs)]
    package_log.setLevel(log_level)
    package_log.propagate = False
    # Records are acyclic: the cyclic collector would only rescan the memo and the answers
    # awaiting their shadow copies, over and over.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    from kvmigrate.recorder.store import open_store, pruner

    convert = RecordConverter(spec.content, spec.source)
    writer = RecordWriter(
        lambda: open_store(spec.url),
        convert,
        spec.settings,
        maintain=pruner(spec.retention_days),
        on_write_error=convert.history.forget,
    )
    batches = _Batches(writer, spec.settings, shared)
    try:
        _receive(conn, batches)
    finally:
        batches.flush()
        writer.stop()
        batches.publish()


class _Batches:
    """Exchanges waiting for their batch: written once `batch_size` are in, or when the
    oldest has waited `flush_interval`."""

    def __init__(self, writer: RecordWriter, settings: WriterSettings, shared: Any) -> None:
        self.writer = writer
        self.settings = settings
        self.shared = shared
        self.items: list[tuple[RecordedExchange, float]] = []
        self.deadline: float | None = None

    def add(self, packed: list[Packed]) -> None:
        for item in packed:
            try:
                self.items.append(unpack(item))
            except Exception:
                self.writer.stats.drop("invalid")
        if self.deadline is None and self.items:
            self.deadline = time.monotonic() + self.settings.flush_interval
        if len(self.items) >= self.settings.batch_size:
            self.flush()

    def wait_s(self) -> float:
        if self.deadline is None:
            return 0.5
        return max(0.0, self.deadline - time.monotonic())

    def flush(self) -> None:
        if self.items:
            self.writer.write_batch(self.items)
        self.items = []
        self.deadline = None
        self.publish()

    def publish(self) -> None:
        stats = self.writer.stats
        values = (
            stats.written,
            stats.batches,
            stats.write_errors,
            stats.dropped.get("queue_full", 0),
            stats.dropped.get("write_error", 0),
            stats.dropped.get("invalid", 0),
            len(self.items),
        )
        for index, value in enumerate(values):
            self.shared[index] = value


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
