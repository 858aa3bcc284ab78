"""Conversation links shared in memory by the workers of `proxy --workers N`.

A worker's next turn may reach any worker, so a link must be where the others can read it
before the client has the answer's last byte. Through the SQLite store that cost a thread
hop and a transaction per batch, a batch as soon as a request arrived, and an answer at
concurrency 1 waited for the write (benchmarks/link_flush_cost.py measures it). Here a link
is 40 bytes written into a file that every worker maps (kvmigrate.continuity.slot_table): a
few microseconds, on the loop, with nothing to wait for. The store still gets every link,
in slow batches, for the pool's next start. Beside it, the pool's chains share the
candidate's ids of their shadow copies (kvmigrate.continuity.shadow_id_table).

The table is a cache with no lock: a torn slot reads as empty, and a link that is not found
here is looked up in the store, as one evicted by a newer link (the oldest in its bucket
goes) is. Only continuity links whose conversation is a derived key (`h:` and 24 hex digits, as
every continuity link's is) fit; `put` refuses the rest, which go through the store as
before.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

from kvmigrate.continuity.shadow_id_table import (
    SHADOW_ID_BUCKETS,
    ShadowIdTable,
    create_shadow_id_table,
)
from kvmigrate.continuity.slot_table import BUCKET_SLOTS, SlotTable, SlotTableError, create_slots
from kvmigrate.policies.conversation import is_derived_key

log = logging.getLogger("kvmigrate.identity")

# A link's payload: the conversation's 12 bytes and the turn.
_LINK = struct.Struct("<12sI")
DEFAULT_BUCKETS = 1 << 16  # 524,288 links, 20 MiB, mapped by every worker, touched as used
FILE_NAME = "conversation-links.table"
ENV = "KVMIGRATE_LINK_TABLE"  # the parent names the file to its workers
_MAX_U32 = 0xFFFFFFFF
LinkTableError = SlotTableError  # the file is not a link table, or cannot be mapped

__all__ = ["BUCKET_SLOTS", "ENV", "LinkTable", "LinkTableError", "create_table", "fits"]


def create_table(
    directory: str, buckets: int = DEFAULT_BUCKETS, shadow_id_buckets: int = SHADOW_ID_BUCKETS
) -> Path:
    """A zeroed table file (sparse: it takes memory as it fills) in the pool's private
    folder, and beside it the table of the chains' shadow ids
    (kvmigrate.continuity.shadow_id_table)."""
    create_shadow_id_table(directory, shadow_id_buckets)
    return create_slots(Path(directory) / FILE_NAME, buckets, _LINK.size)


class LinkTable:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._slots = SlotTable(path, _LINK.size, "link table")
        # The pool's chains share their candidate ids through the table beside it.
        self.shadow_ids = ShadowIdTable.beside(Path(path))

    @classmethod
    def from_environment(cls) -> LinkTable | None:
        """The table the pool's parent made, in a worker; None elsewhere, and None, with a
        warning, where it cannot be mapped (a cleaner emptied /tmp under a running pool): a
        worker started then shares links through the store, as before the table, rather
        than failing to start again and again."""
        path = os.environ.get(ENV)
        if not path:
            return None
        try:
            return cls(path)
        except (OSError, LinkTableError) as exc:
            log.warning("conversation links go through the store only: %s", exc)
            return None

    def put(self, key: str, conversation: str, turn: int, expires_at: float) -> bool:
        """Write a link for every worker to read; False when it does not fit a slot."""
        if not fits(conversation) or not 0 <= turn <= _MAX_U32:
            return False
        try:
            packed = bytes.fromhex(conversation[2:])
        except ValueError:
            return False
        self._slots.put(key, _LINK.pack(packed, turn), expires_at)
        return True

    def get(self, key: str) -> tuple[str, int] | None:
        """The conversation and turn of a link, if a worker wrote it and it has not expired
        or been evicted."""
        payload = self._slots.get(key)
        if payload is None:
            return None
        conversation, turn = _LINK.unpack(payload)
        return "h:" + conversation.hex(), turn


def fits(conversation: str) -> bool:
    """Whether a conversation fits a slot: exactly a derived key's shape, which packs into 12
    bytes and unpacks to itself (a look-alike in upper case, or with a space `bytes.fromhex`
    skips, would come back as another conversation)."""
    return is_derived_key(conversation)
