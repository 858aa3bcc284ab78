"""Anthropic's prompt caching: only prefixes that end at a `cache_control` breakpoint are
written, and a read finds the longest written prefix that ends at a content-block boundary
at most 20 blocks before a breakpoint (Anthropic's lookback), so an agent that moves its one
breakpoint to its newest message each turn reads the previous turn's prefix and writes the
rest. Prefixes shorter than the model's minimum are never cached. Unused prefixes expire.

usage: `cache_read_input_tokens` = the prefix read, `cache_creation_input_tokens` = the
last breakpoint's prefix less that, `input_tokens` = everything else.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

LOOKBACK_BLOCKS = 20


@dataclass(frozen=True, slots=True)
class Breakpoints:
    """Token offsets in a rendered prompt: where each content block ends (`boundaries`,
    increasing) and which of those ends carry `cache_control` (`marked`)."""

    boundaries: tuple[int, ...] = ()
    marked: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class CacheUse:
    read: int
    written: int


class BreakpointCache:
    def __init__(
        self,
        min_tokens: int,
        capacity_tokens: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._min = min_tokens
        self._capacity = capacity_tokens
        self._ttl = ttl_s
        self._clock = clock
        self._entries: OrderedDict[int, tuple[int, float]] = OrderedDict()  # key: (len, used)
        self._tokens = 0

    def lookup_and_insert(
        self, tokens: Sequence[str], points: Breakpoints, salt: str = ""
    ) -> CacheUse:
        now = self._clock()
        keys = _chain(tokens, points.boundaries, salt)
        marked = [i for i, end in enumerate(points.boundaries) if end in points.marked]
        read = 0
        for i in reversed(marked):
            read = self._longest_alive(keys, points.boundaries, i, now)
            if read:
                break
        written = 0
        for i in marked:
            end = points.boundaries[i]
            if end < self._min:
                continue
            self._put(keys[i], end, now)
            written = max(written, end - read)
        self._evict()
        return CacheUse(read, written)

    def _longest_alive(
        self, keys: list[int], boundaries: tuple[int, ...], at: int, now: float
    ) -> int:
        for i in range(at, max(at - LOOKBACK_BLOCKS, -1), -1):
            entry = self._entries.get(keys[i])
            if entry is not None and now - entry[1] <= self._ttl:
                self._entries[keys[i]] = (entry[0], now)  # a hit refreshes the TTL
                return boundaries[i]
        return 0

    def _put(self, key: int, length: int, now: float) -> None:
        if key not in self._entries:
            self._tokens += length
        self._entries[key] = (length, now)
        self._entries.move_to_end(key)

    def _evict(self) -> None:
        while self._tokens > self._capacity and self._entries:
            _, (length, _) = self._entries.popitem(last=False)
            self._tokens -= length


def _chain(tokens: Sequence[str], boundaries: tuple[int, ...], salt: str) -> list[int]:
    """A chain hash at each boundary: equal keys mean equal prefixes up to there."""
    keys: list[int] = []
    parent, start = hash(salt), 0
    for end in boundaries:
        parent = hash((parent, tuple(tokens[start:end])))
        keys.append(parent)
        start = end
    return keys
