"""Fixed-size slots in a file that every worker of `proxy --workers N` maps: what one worker
writes, the others read at once, with no store, lock or thread hop between them.

A slot is a key's digest, a payload of fixed size, an expiry (unix seconds) and a checksum.
A key lives in one bucket of BUCKET_SLOTS slots; a full bucket gives up the slot that
expires first. There is no lock: a slot read while another process writes it, or written
by two at once, fails its checksum and reads as empty. So a table is a cache in front of a
store that holds everything, never the only copy of anything.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
import zlib
from pathlib import Path

BUCKET_SLOTS = 8  # a key lives in one bucket of slots; a full bucket evicts its oldest
_MAX_U32 = 0xFFFFFFFF


class SlotTableError(Exception):
    """The file is not a table of this slot size (a wrong size), or cannot be mapped."""


def create_slots(path: Path, buckets: int, payload: int) -> Path:
    """A zeroed table file (sparse: it takes memory as it fills)."""
    with open(path, "wb") as file:
        file.truncate(buckets * BUCKET_SLOTS * _layout(payload).size)
    return path


def _layout(payload: int) -> struct.Struct:
    """The key's digest, the payload, expiry, checksum."""
    return struct.Struct(f"<16s{payload}sII")


class SlotTable:
    def __init__(self, path: str | os.PathLike[str], payload: int, what: str) -> None:
        """Map `path`, a table of `payload`-byte slots; `what` names it in errors."""
        self._slot = slot = _layout(payload)
        self._checked = slot.size - 4  # the checksum covers the rest of the slot
        # A bucket's slots in one read, for the expiries when one must be given up.
        self._bucket_struct = struct.Struct("<" + slot.format[1:] * BUCKET_SLOTS)
        with open(path, "r+b") as file:
            size = os.fstat(file.fileno()).st_size
            bucket_bytes = BUCKET_SLOTS * slot.size
            if size == 0 or size % bucket_bytes:
                raise SlotTableError(f"{path}: {size} bytes is not a {what}")
            try:
                self._map = mmap.mmap(file.fileno(), size)
            except (OSError, ValueError) as exc:
                raise SlotTableError(f"{path}: {exc}") from exc
        self._buckets = size // bucket_bytes
        self._bucket_bytes = bucket_bytes

    def put(self, key: str, payload: bytes, expires_at: float) -> None:
        """Write `key`'s slot (a shorter payload is padded with zero bytes)."""
        digest = _digest(key)
        offset = self._slot_of(digest, self._bucket(digest))
        expires = min(int(expires_at) + 1, _MAX_U32)
        body = self._slot.pack(digest, payload, expires, 0)[: self._checked]
        self._map[offset : offset + self._slot.size] = body + zlib.crc32(body).to_bytes(4, "little")

    def get(self, key: str) -> bytes | None:
        """`key`'s payload, if a worker wrote it and it has not expired or been evicted."""
        digest = _digest(key)
        offset = self._find(digest, self._bucket(digest))
        if offset < 0:
            return None
        _, payload, expires, check = self._slot.unpack_from(self._map, offset)
        if check != zlib.crc32(self._map[offset : offset + self._checked]) or expires < time.time():
            return None
        return bytes(payload)

    def _bucket(self, digest: bytes) -> int:
        return int.from_bytes(digest[:8], "little") % self._buckets * self._bucket_bytes

    def _find(self, digest: bytes, start: int) -> int:
        """The offset of the slot holding `digest` in the bucket at `start`, or -1."""
        end = start + self._bucket_bytes
        found = self._map.find(digest, start, end)
        while found >= 0 and (found - start) % self._slot.size:
            # The digest's bytes inside another slot's fields: not a key.
            found = self._map.find(digest, found + 1, end)
        return found

    def _slot_of(self, digest: bytes, start: int) -> int:
        """Where to write `digest`: its own slot, else the one that expires first (an empty
        slot reads as expired long ago; a torn one goes when it is the oldest)."""
        found = self._find(digest, start)
        if found >= 0:
            return found
        expiries = self._bucket_struct.unpack_from(self._map, start)[2::4]
        return start + expiries.index(min(expiries)) * self._slot.size


def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
