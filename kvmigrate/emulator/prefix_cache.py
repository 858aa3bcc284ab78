"""Prefix caches: vLLM's block-hashed automatic prefix cache and OpenAI's prompt caching rule.

Both are one structure. A prompt is cut into chunks; chunk i is identified by a chain hash of
chunk i's tokens and the hash of chunk i-1, so a chunk hit implies the whole prefix before it
matched. A lookup walks the chain from the start and stops at the first miss; the prompt's
chunks are then inserted (or refreshed) in least-recently-used order, and the oldest are
evicted beyond the capacity.

- vLLM: every chunk is one block of `block_size` tokens, only whole blocks count, and a prompt
  that hits in full still recomputes its last block, because the engine needs at least one
  token to compute logits from.
- OpenAI: prompts under 1,024 tokens never cache; the first chunk is 1,024 tokens and each
  further one 128, which gives cached counts of 1024 + 128k. Unused prefixes expire.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CacheResult:
    prompt_tokens: int
    cached_tokens: int


class PrefixCache:
    def __init__(
        self,
        first_chunk: int,
        chunk: int,
        capacity_tokens: int,
        *,
        recompute_last: bool,
        ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if first_chunk < 1 or chunk < 1:
            raise ValueError("chunk sizes must be >= 1")
        self._first = first_chunk
        self._chunk = chunk
        self._capacity = capacity_tokens
        self._recompute_last = recompute_last
        self._ttl = ttl_s
        self._clock = clock
        # chain hash -> (chunk length in tokens, last use)
        self._entries: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self._tokens = 0

    @classmethod
    def vllm(cls, block_size: int, capacity_tokens: int) -> PrefixCache:
        return cls(block_size, block_size, capacity_tokens, recompute_last=True)

    @classmethod
    def hosted(cls, capacity_tokens: int, ttl_s: float) -> PrefixCache:
        return cls(1024, 128, capacity_tokens, recompute_last=False, ttl_s=ttl_s)

    @property
    def cached_token_count(self) -> int:
        return self._tokens

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def _chain(self, tokens: Sequence[str], salt: str) -> list[tuple[int, int]]:
        """(chain hash, end offset) for every whole chunk of the prompt."""
        chain: list[tuple[int, int]] = []
        parent = hash(salt)
        start, size = 0, self._first
        while start + size <= len(tokens):
            parent = hash((parent, tuple(tokens[start : start + size])))
            chain.append((parent, start + size))
            start, size = start + size, self._chunk
        return chain

    def _alive(self, key: int, now: float) -> bool:
        entry = self._entries.get(key)
        if entry is None:
            return False
        return self._ttl is None or now - entry[1] <= self._ttl

    def lookup_and_insert(self, tokens: Sequence[str], salt: str = "") -> CacheResult:
        """Count the cached prefix of `tokens`, then cache all of its whole chunks.

        `salt` separates caches that must not share entries (different models)."""
        now = self._clock()
        chain = self._chain(tokens, salt)
        cached = 0
        for key, end in chain:
            if not self._alive(key, now):
                break
            cached = end
        if self._recompute_last and chain and cached == len(tokens):
            cached -= self._chunk
        for index, (key, _) in enumerate(chain):
            size = self._first if index == 0 else self._chunk
            if key in self._entries:
                self._entries.move_to_end(key)
            else:
                self._tokens += size
            self._entries[key] = (size, now)
        self._evict()
        return CacheResult(prompt_tokens=len(tokens), cached_tokens=max(cached, 0))

    def _evict(self) -> None:
        while self._tokens > self._capacity and self._entries:
            _, (size, _) = self._entries.popitem(last=False)
            self._tokens -= size
