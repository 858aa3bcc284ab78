"""One replica's KV cache: fixed-size blocks, kept after a request ends, evicted LRU.

vLLM's automatic prefix caching names each full block by a hash chained over the blocks
before it (block i's hash covers its tokens and block i-1's hash), so a block is found
again only when the whole prefix before it matches. A request holds its blocks while it
runs; when it ends they stay cached but become evictable, and a new request that needs
room takes the least recently used evictable blocks, a finished request's last block
first (vLLM frees a sequence's blocks tail first, for exactly this reason).

Two consequences keep this model exact and fast. A request touches all of its blocks at
once, so the cached blocks of one chain are always a prefix of it: the cache can hold, per
chain, the count of its cached blocks rather than every block's hash. And chains here are
conversations, which share no blocks with each other (the simulator has token counts, not
text, so it cannot see a shared system prompt: that makes its hit rates a floor).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True)
class PrefixCache:
    """`capacity` blocks. `lookup` says how much of a prompt is cached; `acquire` holds a
    request's blocks (evicting others if needed) and `release` returns them to the cache."""

    capacity: int
    block_size: int
    enabled: bool = True
    used: int = 0  # blocks held or cached
    pinned: int = 0  # blocks held by running requests (not evictable)
    evictions: int = 0  # blocks evicted, over the cache's life
    _chains: dict[int, int] = field(default_factory=dict)  # cached blocks, every chain
    _refs: dict[int, int] = field(default_factory=dict)  # running requests per held chain
    # The evictable chains (no running request), least recently used first. Held chains
    # stay out of it, so an eviction walks only what it may take: with hundreds of
    # sequences running, skipping them on every eviction was the sweep's hottest loop.
    _idle: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def cached_blocks(self, chain: int) -> int:
        return self._chains.get(chain, 0)

    def lookup(self, chain: int, prompt_tokens: int) -> int:
        """Prompt tokens served from the cache. At least one token is always computed, as in
        vLLM, which recomputes the last token of a fully cached prompt to get its logits."""
        if not self.enabled:
            return 0
        usable = (prompt_tokens - 1) // self.block_size
        return min(self._chains.get(chain, 0), usable) * self.block_size

    def evictable(self, chain: int) -> int:
        own = 0 if self._refs.get(chain) else self._chains.get(chain, 0)
        return self.used - self.pinned - own

    def fits(self, blocks: int) -> bool:
        """Whether a request of `blocks` blocks could ever run here: vLLM will not start
        with a `max_model_len` above what its KV cache holds, and refuses (HTTP 400) a
        request longer than that, so a request larger than the whole cache never runs."""
        return blocks <= self.capacity

    def acquire(self, chain: int, blocks: int) -> bool:
        """Hold `blocks` blocks of `chain` (its cached ones count); False when they do not
        fit even after evicting every evictable block of other chains. `used` never
        exceeds `capacity`: a request larger than the cache never fits (see `fits`)."""
        have = self._chains.get(chain, 0)
        extra = max(0, blocks - have)
        short = self.used + extra - self.capacity
        if short > 0 and short > self.evictable(chain):
            return False
        self._idle.pop(chain, None)  # held from now: not evictable, not even to make room
        if short > 0:
            self._evict(short)
        held = max(have, blocks)
        if self._refs.get(chain):
            self.pinned += held - have
        else:
            self.pinned += held
        self._refs[chain] = self._refs.get(chain, 0) + 1
        self._chains[chain] = held
        self.used += held - have
        return True

    def release(self, chain: int, tokens: int) -> None:
        """A request on `chain` ended with `tokens` in its sequence: its full blocks stay
        cached (most recently used), the partial last one is freed."""
        held = self._chains[chain]
        refs = self._refs[chain] - 1
        keep = min(held, tokens // self.block_size) if self.enabled else 0
        if refs:
            self._refs[chain] = refs
            return  # another request on the chain still holds it all
        del self._refs[chain]
        self.pinned -= held
        self.used -= held - keep
        if keep:
            self._chains[chain] = keep
            self._idle[chain] = None  # the most recently used
        else:
            del self._chains[chain]

    def _evict(self, blocks: int) -> None:
        """Take `blocks` from the idle chains, least recently used first."""
        emptied: list[int] = []
        for chain in self._idle:
            if blocks <= 0:
                break
            have = self._chains[chain]
            taken = min(have, blocks)
            blocks -= taken
            self.used -= taken
            self.evictions += taken
            if taken < have:
                self._chains[chain] = have - taken  # its tail goes; its head stays the oldest
            else:
                emptied.append(chain)
        for chain in emptied:  # not while iterating over them
            del self._chains[chain]
            del self._idle[chain]
