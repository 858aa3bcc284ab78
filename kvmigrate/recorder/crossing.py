"""What crosses from the proxy to a recorder worker: each exchange's state, packed; what
the worker needs to start; and the counters it publishes back in shared memory."""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from typing import Any

import orjson

from kvmigrate.exchange import STATE_FIELDS, Exchange, exchange_from_state, exchange_scalars
from kvmigrate.recorder.convert import new_hash_key
from kvmigrate.recorder.writer import WriterSettings
from kvmigrate.wire.chunk_log import MAX_RECORDED_BYTES

# Counters in shared memory, in this order. The worker publishes them, except `urgent`,
# which the proxy sets to have it finish at the raised priority (kvmigrate.pacer).
SHARED_COUNTERS = (
    "written", "batches", "write_errors", "queue_full", "write_error", "invalid", "depth",
    "received", "acked", "acked_offset", "nudged", "urgent", "raised",
)  # fmt: skip
# Not counts that a restarted worker continues: what the worker holds now, how far it has
# acked its spool lane (the next worker starts there), and the proxy's own word.
GAUGES = frozenset({"depth", "acked_offset", "urgent"})

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
    """Everything the child needs to build its writer. It crosses as `state()`, plain
    values: unpickling this class would import the whole recorder, a slow start on a busy
    machine, before the child can ask to die with its parent (kvmigrate.background)."""

    url: str
    content: str
    source: str
    retention_days: int | None
    settings: WriterSettings
    # What conversation ids are hashed with: one key for every worker of the recorder.
    hash_key: bytes = field(default_factory=new_hash_key)
    durable: bool = False  # each commit on disk before the spool is acked (durability: fsync)

    def state(self) -> tuple[Any, ...]:
        return astuple(self)

    @classmethod
    def from_state(cls, state: tuple[Any, ...]) -> WorkerSpec:
        url, content, source, retention_days, settings, *rest = state
        return cls(url, content, source, retention_days, WriterSettings(*settings), *rest)
