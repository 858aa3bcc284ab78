"""What the online checker keeps per conversation, and the bounded store that keeps it.

A fingerprint is the expected next prompt (the last request plus its answer) reduced to one
hash and one token count per segment, plus the segments themselves compressed. The hashes
settle the common case, an append-only turn, without touching the text; the compressed
segments are opened only when a turn breaks, to say why.
"""

from __future__ import annotations

import zlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from kvmigrate.cachecheck.render import Rendering, Segment

# Per-entry bookkeeping beyond the arrays and the blob: the OrderedDict node, the key, the
# object headers. An estimate is enough: the budget bounds memory, it need not be exact.
ENTRY_OVERHEAD = 400


@dataclass(slots=True)
class Fingerprint:
    hashes: array[int]
    tokens: array[int]
    blob: bytes
    messages: int
    stamp: float
    breakpoint: int | None = None  # the last `cache_control` (kvmigrate.cachecheck.breakpoints)

    @classmethod
    def of(
        cls,
        rendering: Rendering,
        tokens: Sequence[int],
        now: float,
        breakpoint: int | None = None,
    ) -> Fingerprint:
        rows = [[s.text, s.value, s.message, s.role, s.field] for s in rendering.segments]
        return cls(
            array("q", (hash(s.text) for s in rendering.segments)),
            array("q", tokens),
            zlib.compress(orjson.dumps(rows), 1),
            rendering.messages,
            now,
            breakpoint,
        )

    @property
    def size(self) -> int:
        return ENTRY_OVERHEAD + len(self.blob) + 8 * (len(self.hashes) + len(self.tokens))

    def rendering(self) -> Rendering:
        rows = orjson.loads(zlib.decompress(self.blob))
        return Rendering([Segment(*row) for row in rows], self.messages)


class FingerprintStore:
    """An LRU of fingerprints bounded by count, bytes and age. Used by one thread only."""

    def __init__(
        self, max_entries: int = 50_000, max_bytes: int = 256 << 20, ttl_s: float = 3600.0
    ):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.bytes = 0
        self.evicted = 0
        self._entries: OrderedDict[str, Fingerprint] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> Fingerprint | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now - entry.stamp > self.ttl_s:
            self._remove(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: Fingerprint) -> None:
        if key in self._entries:
            self._remove(key)
        self._entries[key] = entry
        self.bytes += entry.size
        self._evict(entry.stamp)

    def _evict(self, now: float) -> None:
        while self._entries and (
            len(self._entries) > self.max_entries
            or self.bytes > self.max_bytes
            or now - next(iter(self._entries.values())).stamp > self.ttl_s
        ):
            self._remove(next(iter(self._entries)))
            self.evicted += 1

    def _remove(self, key: str) -> None:
        self.bytes -= self._entries.pop(key).size
