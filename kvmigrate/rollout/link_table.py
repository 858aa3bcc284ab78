"""Conversation links shared in memory by the workers of `proxy --workers N`.

A worker's next turn may reach any worker, so a link must be where the others can read it
before the client has the answer's last byte. Through the SQLite store that cost a thread
hop and a transaction per batch, a batch as soon as a request arrived, and an answer at
concurrency 1 waited for the write (two workers added 0.70 ms there, one 0.42). Here a link
is 40 bytes written into a file that every worker maps: a few microseconds, on the loop,
with nothing to wait for. The store still gets every link, in slow batches, for the pool's
next start.

The table is a cache with no lock. A slot carries a checksum, so a slot read while another
process writes it, or written by two at once, reads as empty; a link that is not found here
is looked up in the store, as one evicted by a newer link (the oldest in its bucket goes)
is. Only continuity links whose conversation is a derived key (`h:` and 24 hex digits, as
every continuity link's is) fit; `put` refuses the rest, which go through the store as
before.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import struct
import time
import zlib
from pathlib import Path

log = logging.getLogger("kvmigrate.identity")

# The key's digest, the conversation's 12 bytes, turn, expiry (unix seconds), checksum.
_SLOT = struct.Struct("<16s12sIII")
_CHECKED = _SLOT.size - 4  # the checksum covers the rest of the slot
BUCKET_SLOTS = 8  # a key lives in one bucket of slots; a full bucket evicts its oldest
_BUCKET_EXPIRIES = struct.Struct("<" + "16s12sIII" * BUCKET_SLOTS)  # a bucket in one read
DEFAULT_BUCKETS = 1 << 16  # 524,288 links, 20 MiB, mapped by every worker, touched as used
FILE_NAME = "conversation-links.table"
ENV = "KVMIGRATE_LINK_TABLE"  # the parent names the file to its workers
_MAX_U32 = 0xFFFFFFFF


class LinkTableError(Exception):
    """The file is not a link table (a wrong size), or cannot be mapped."""


def create_table(directory: str, buckets: int = DEFAULT_BUCKETS) -> Path:
    """A zeroed table file (sparse: it takes memory as it fills) in the pool's private folder."""
    path = Path(directory) / FILE_NAME
    with open(path, "wb") as file:
        file.truncate(buckets * BUCKET_SLOTS * _SLOT.size)
    return path


class LinkTable:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        with open(path, "r+b") as file:
            size = os.fstat(file.fileno()).st_size
            bucket_bytes = BUCKET_SLOTS * _SLOT.size
            if size == 0 or size % bucket_bytes:
                raise LinkTableError(f"{path}: {size} bytes is not a link table")
            try:
                self._map = mmap.mmap(file.fileno(), size)
            except (OSError, ValueError) as exc:
                raise LinkTableError(f"{path}: {exc}") from exc
        self._buckets = size // bucket_bytes
        self._bucket_bytes = bucket_bytes

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
        digest = _digest(key)
        offset = self._slot_of(digest, self._bucket(digest))
        body = _SLOT.pack(digest, packed, turn, min(int(expires_at) + 1, _MAX_U32), 0)[:_CHECKED]
        self._map[offset : offset + _SLOT.size] = body + zlib.crc32(body).to_bytes(4, "little")
        return True

    def get(self, key: str) -> tuple[str, int] | None:
        """The conversation and turn of a link, if a worker wrote it and it has not expired
        or been evicted."""
        digest = _digest(key)
        start = self._bucket(digest)
        offset = self._find(digest, start)
        if offset < 0:
            return None
        _, conversation, turn, expires, check = _SLOT.unpack_from(self._map, offset)
        if check != zlib.crc32(self._map[offset : offset + _CHECKED]) or expires < time.time():
            return None
        return "h:" + conversation.hex(), turn

    def _bucket(self, digest: bytes) -> int:
        return int.from_bytes(digest[:8], "little") % self._buckets * self._bucket_bytes

    def _find(self, digest: bytes, start: int) -> int:
        """The offset of the slot holding `digest` in the bucket at `start`, or -1."""
        end = start + self._bucket_bytes
        found = self._map.find(digest, start, end)
        while found >= 0 and (found - start) % _SLOT.size:
            # The digest's bytes inside another slot's fields: not a key.
            found = self._map.find(digest, found + 1, end)
        return found

    def _slot_of(self, digest: bytes, start: int) -> int:
        """Where to write `digest`: its own slot, else the one that expires first (an empty
        slot reads as expired long ago; a torn one goes when it is the oldest)."""
        found = self._find(digest, start)
        if found >= 0:
            return found
        expiries = _BUCKET_EXPIRIES.unpack_from(self._map, start)[3::5]
        return start + expiries.index(min(expiries)) * _SLOT.size


def fits(conversation: str) -> bool:
    """Whether a conversation may fit a slot: a derived key's shape (`put` checks its hex)."""
    return len(conversation) == 26 and conversation.startswith("h:")


def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
