"""What a recorder worker holds between reading exchanges and writing their records.

Exchanges read wait in `raw` to be converted; records wait in `records` for their batch,
written once `batch_size` are in or the oldest has waited `flush_interval`; the latest
answered totals (recorder.tally) are written with the last of them. Both steps can be cut
short (kvmigrate.pacer: a step at the lowest priority holds up the raised thread until it
ends): `convert(stop)` stops when `stop()` says so, `flush(limit)` writes at most `limit`
records.

With a spool, `done` is the lane offset before which every frame is converted, and
`written_to` the one before which every record is also written or counted as dropped:
what the worker may ack. A frame whose records were written in part is read again after a
crash, and the store skips the request ids it already holds.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from kvmigrate.recorder.crossing import SHARED_COUNTERS, Packed, unpack
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.spool import EXCHANGES, TALLY, Frame
from kvmigrate.recorder.store import AnsweredRow
from kvmigrate.recorder.writer import RecordWriter, WriterSettings

_DROPS = ("queue_full", "write_error", "invalid")


class Batches:
    def __init__(
        self, writer: RecordWriter, settings: WriterSettings, shared: Any, source: str
    ) -> None:
        self.writer = writer
        self.settings = settings
        self.shared = shared
        self.source = source
        # An item (None: a frame without exchanges), and the end offset of its frame when
        # it is the frame's last (else 0).
        self.raw: deque[tuple[Packed | None, int]] = deque()
        self.records: list[Record] = []
        self.answered: dict[tuple[float, str], int] = {}
        self.deadline: float | None = None
        self.received = 0  # items taken
        self.converted = 0  # ... converted, or found invalid
        self.acked = 0  # ... whose records are written, or counted as dropped
        self.done = 0
        self.written_to = 0

    def take(self, packed: list[Packed], end: int = 0) -> None:
        self.received += len(packed)
        self.raw.extend((item, 0) for item in packed[:-1])
        self.raw.append((packed[-1] if packed else None, end))

    def take_frame(self, frame: Frame) -> None:
        if frame.kind == EXCHANGES:
            try:
                self.take(msgspec.msgpack.decode(frame.payload), frame.end)
                return
            except msgspec.DecodeError:
                self.writer.stats.drop("invalid", frame.items)
        elif frame.kind == TALLY:
            for bucket, role, count in msgspec.msgpack.decode(frame.payload):
                key = (bucket, role)
                self.answered[key] = max(count, self.answered.get(key, 0))
        self.raw.append((None, frame.end))

    def convert(self, stop: Callable[[], bool]) -> None:
        """Convert what was taken, until `stop()` says to stop (checked after each)."""
        while self.raw:
            item, end = self.raw.popleft()
            if item is not None:
                self.converted += 1
                self._convert_one(item)
            if end:
                self.done = end
            if stop():
                break
        if self.deadline is None and (self.records or self.answered or self.converted > self.acked):
            self.deadline = time.monotonic() + self.settings.flush_interval

    def _convert_one(self, item: Packed) -> None:
        try:
            exchange = unpack(item)
        except Exception:
            self.writer.stats.drop("invalid")
            return
        record = self.writer.convert(exchange)
        if record is not None:
            self.records.append(record)

    def ready(self) -> bool:
        """Whether a batch is full, or its oldest record has waited long enough."""
        if len(self.records) >= self.settings.batch_size:
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def wait_s(self) -> float:
        if self.deadline is None:
            return 0.5
        return max(0.0, self.deadline - time.monotonic())

    def flush(self, limit: int | None = None) -> bool:
        """Write up to `limit` records (None: all), the answered totals with the last;
        whether everything converted is now written."""
        chunk = self.records if limit is None else self.records[:limit]
        last = len(chunk) == len(self.records)
        answered = []
        if last:
            answered = [AnsweredRow(self.source, b, r, n) for (b, r), n in self.answered.items()]
        if chunk or answered:
            self.writer.write_records(chunk, answered)
        del self.records[: len(chunk)]
        if last:
            self.answered = {}
            self.deadline = None
            self.acked = self.converted
            self.written_to = self.done
        return last

    def publish(self, acked_offset: int = 0) -> None:
        """Counters into shared memory, where the proxy reads them (SHARED_COUNTERS)."""
        stats = self.writer.stats
        values = {
            "written": stats.written,
            "batches": stats.batches,
            "write_errors": stats.write_errors,
            "depth": len(self.records) + len(self.raw),
            "received": self.received,
            "acked": self.acked,
            **{reason: stats.dropped.get(reason, 0) for reason in _DROPS},
        }
        if acked_offset:
            values["acked_offset"] = acked_offset
        for name, value in values.items():
            self.shared[SHARED_COUNTERS.index(name)] = value
