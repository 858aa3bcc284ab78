"""The candidate's own response ids of a pool's shadow copies, shared in memory by the
workers of `proxy --workers N`, so a chain stays shadowed whichever worker each turn reaches.

The shadow copy of turn N must name the candidate's id of turn N-1, which the copy of that
turn learns when it ends, on the worker that sent it; turn N may reach another worker
before then (a client on a new connection, an SDK that opens a second one). The worker
that sends the copy says so here, and then how it ended: the id, or none (the copy failed,
or was never sent). Another worker's copy of the next turn reads it, and waits for a copy
that runs as long as a copy on the same worker waits for its own (kvmigrate.continuity.chains):
the shadow copies' deadline bounds both. The store gets the id too, for turns that come
later than this table keeps ids and for the pool's next start.
"""

from __future__ import annotations

from pathlib import Path

from kvmigrate.continuity.slot_table import SlotTable, SlotTableError, create_slots

FILE_NAME = "chain-shadow-ids.table"
# A state byte, then an id up to 255 bytes (a LiteLLM-wrapped id is long).
_PAYLOAD = 256
# 32,768 copies, 9 MiB, touched as used: an id is read within moments of being written, by
# the next turn's copy; an older one is read from the store.
SHADOW_ID_BUCKETS = 1 << 12
# What a worker says of a copy.
RUNNING = "running"  # sent, not ended
ENDED = "ended"  # ended: with the candidate's id, or none ("")
IN_STORE = "in_store"  # ended with an id too long for a slot: the store has it
_STATES = {b"r": RUNNING, b"e": ENDED, b"s": IN_STORE}


def create_shadow_id_table(directory: str, buckets: int = SHADOW_ID_BUCKETS) -> Path:
    return create_slots(Path(directory) / FILE_NAME, buckets, _PAYLOAD)


class ShadowIdTable:
    def __init__(self, path: str | Path) -> None:
        self._slots = SlotTable(path, _PAYLOAD, "shadow id table")

    @classmethod
    def beside(cls, links: Path) -> ShadowIdTable | None:
        """The table next to the pool's link table; None where it cannot be mapped: the
        pool's chains then share their ids through the store alone."""
        try:
            return cls(links.with_name(FILE_NAME))
        except (OSError, SlotTableError):
            return None

    def running(self, primary_id: str, owner: str, expires_at: float) -> None:
        """A copy (to `owner`, "" for the model's only candidate) of the turn that answered
        `primary_id` is on its way."""
        self._slots.put(_key(primary_id, owner), b"r", expires_at)

    def ended(self, primary_id: str, owner: str, own_id: str | None, expires_at: float) -> None:
        """That copy ended, with the candidate's `own_id` or without one."""
        encoded = (own_id or "").encode("utf-8", "surrogatepass")
        payload = b"e" + encoded if len(encoded) < _PAYLOAD and b"\0" not in encoded else b"s"
        self._slots.put(_key(primary_id, owner), payload, expires_at)

    def read(self, primary_id: str, owner: str) -> tuple[str, str] | None:
        """What a worker said of that copy, and the candidate's id once it ended ("": none);
        None where no worker said anything (not sent yet, or never)."""
        payload = self._slots.get(_key(primary_id, owner))
        if payload is None or (state := _STATES.get(payload[:1])) is None:
            return None  # never written, or a torn slot
        return state, payload[1:].rstrip(b"\0").decode("utf-8", "surrogatepass")


def _key(primary_id: str, owner: str) -> str:
    return owner + "\x00" + primary_id
