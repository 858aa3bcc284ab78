"""The candidate's own response ids of a pool's shadow copies, shared in memory by the
workers of `proxy --workers N`, so a chain stays mirrored whichever worker each turn reaches.

The shadow copy of turn N must name the candidate's id of turn N-1, which the copy of that
turn learns when it ends, on the worker that sent it; turn N may reach another worker
before then (a client on a new connection, an SDK that opens a second one). The worker
that sent the copy writes its end here, the id or "none" (the copy failed, or was never
sent); another worker's copy of the next turn reads it, waiting for it as a copy on the
same worker waits for its own (kvmigrate.rollout.chains). The store gets the id too, for
turns that come later than this table keeps ids and for the pool's next start.
"""

from __future__ import annotations

from pathlib import Path

from kvmigrate.rollout.slot_table import SlotTable, SlotTableError, create_slots

FILE_NAME = "chain-mirrors.table"
# An id up to 255 bytes (a LiteLLM-wrapped id is long): one length byte, then the id.
_PAYLOAD = 256
# 32,768 ids, 9 MiB, touched as used: an id is read within moments of being written, by
# the next turn's copy; an older one is read from the store.
MIRROR_BUCKETS = 1 << 12
_ENDED = b"\x00"  # the copy ended without an id


def create_mirror_table(directory: str, buckets: int = MIRROR_BUCKETS) -> Path:
    return create_slots(Path(directory) / FILE_NAME, buckets, _PAYLOAD)


class MirrorTable:
    def __init__(self, path: str | Path) -> None:
        self._slots = SlotTable(path, _PAYLOAD, "mirror table")

    @classmethod
    def beside(cls, links: Path) -> MirrorTable | None:
        """The table next to the pool's link table; None where it cannot be mapped: the
        pool's chains then share their ids through the store alone."""
        try:
            return cls(links.with_name(FILE_NAME))
        except (OSError, SlotTableError):
            return None

    def ended(self, primary_id: str, owner: str, own_id: str | None, expires_at: float) -> None:
        """The copy (to `owner`) of the turn that answered `primary_id` ended, with the
        candidate's `own_id` or without one. An id too long for a slot is not written: the
        reader finds it in the store."""
        if own_id is None:
            payload = _ENDED
        else:
            encoded = own_id.encode("utf-8", "surrogatepass")
            if not encoded or len(encoded) >= _PAYLOAD:
                return
            payload = bytes((len(encoded),)) + encoded
        self._slots.put(_key(primary_id, owner), payload, expires_at)

    def read(self, primary_id: str, owner: str) -> str | None:
        """The candidate's id; "" when its copy ended without one; None while no worker
        has said (still running, or its end was not written here)."""
        payload = self._slots.get(_key(primary_id, owner))
        if payload is None:
            return None
        size = payload[0]
        return payload[1 : 1 + size].decode("utf-8", "surrogatepass")


def _key(primary_id: str, owner: str) -> str:
    return owner + "\x00" + primary_id
