"""The per-replica prefix cache: what a prompt finds cached, and what eviction takes."""

from __future__ import annotations

import pytest

from kvmigrate.plan.prefix_cache import PrefixCache

B = 16


def cache(capacity: int = 100, enabled: bool = True) -> PrefixCache:
    return PrefixCache(capacity, B, enabled)


def run(c: PrefixCache, chain: int, prompt: int, output: int) -> int:
    """One request start to end; the prompt tokens it found cached."""
    hit = c.lookup(chain, prompt)
    assert c.acquire(chain, -(-(prompt + output) // B))
    c.release(chain, prompt + output)
    return hit


@pytest.mark.parametrize(
    ("first", "second_prompt", "expected_hit"),
    [
        ((100, 20), 200, 112),  # 120 tokens ran: 7 full blocks stay cached, the partial goes
        ((96, 0 + 1), 200, 96),  # 97 tokens: 6 full blocks
        ((100, 20), 113, 112),  # the whole cached prefix, and the prompt goes one token past it
        ((100, 20), 112, 96),  # a fully cached prompt recomputes its last token (its block)
        ((10, 5), 200, 0),  # less than one block: nothing to reuse
    ],
)
def test_a_later_turn_finds_the_full_blocks_of_the_turn_before(
    first: tuple[int, int], second_prompt: int, expected_hit: int
) -> None:
    c = cache()
    assert run(c, 1, *first) == 0
    assert run(c, 1, second_prompt, 10) == expected_hit


def test_other_conversations_share_nothing() -> None:
    c = cache()
    run(c, 1, 100, 20)
    assert c.lookup(2, 200) == 0


def test_disabled_cache_finds_nothing_and_keeps_nothing() -> None:
    c = cache(enabled=False)
    run(c, 1, 100, 20)
    assert c.lookup(1, 200) == 0
    assert c.used == 0


def test_eviction_takes_the_least_recently_used_chain_tail_first() -> None:
    c = cache(capacity=10)
    run(c, 1, 64, 0)  # 4 blocks, oldest
    run(c, 2, 64, 0)  # 4 blocks
    run(c, 1, 64, 0)  # chain 1 used again: now chain 2 is the least recently used
    assert c.used == 8
    assert c.acquire(3, 5)  # needs 3 more than the 2 free: 3 blocks off chain 2's tail
    assert c.cached_blocks(2) == 1
    assert c.cached_blocks(1) == 4
    assert c.evictions == 3
    assert c.lookup(2, 200) == 16  # what is left of chain 2 is its head, still a valid prefix


def test_blocks_held_by_a_running_request_are_never_evicted() -> None:
    c = cache(capacity=10)
    assert c.acquire(1, 6)  # running, holds 6
    run(c, 2, 48, 0)  # 3 blocks cached, evictable
    assert not c.acquire(3, 8)  # 1 free + 3 evictable < 8
    assert c.cached_blocks(2) == 3  # a failed acquire evicts nothing
    assert c.acquire(3, 4)  # 1 free + 3 evicted
    assert c.cached_blocks(1) == 6
    assert c.used == 10
    assert c.pinned == 10


@pytest.mark.parametrize(
    ("capacity", "blocks", "fits"), [(4, 4, True), (4, 5, False), (4, 8, False)]
)
def test_a_request_larger_than_the_whole_cache_never_fits_even_alone(
    capacity: int, blocks: int, fits: bool
) -> None:
    """The issue's case: PrefixCache(4, 16), acquire(1, 8), release(1, 128) left used == 8."""
    c = cache(capacity=capacity)
    assert c.fits(blocks) is fits
    assert c.acquire(1, blocks) is fits
    if fits:
        c.release(1, blocks * B)
    assert c.used == (blocks if fits else 0)
    assert c.pinned == 0
    assert c.lookup(1, blocks * B + 1) == (blocks * B if fits else 0)


def test_two_requests_on_one_chain_release_it_once_both_end() -> None:
    c = cache()
    assert c.acquire(1, 4)
    assert c.acquire(1, 6)
    assert c.pinned == 6
    c.release(1, 64)
    assert c.pinned == 6  # the second still runs
    c.release(1, 96)
    assert c.pinned == 0
    assert c.cached_blocks(1) == 6


# Sequences of (chain, blocks, tokens at release): every acquire is followed, later, by
# its release, interleaved as requests overlap on a replica. `used` must never pass the
# capacity, `pinned` never pass `used`, and the chains' blocks must add up to `used`.
SEQUENCES = {
    "larger than the cache": [("a", 1, 8, 128), ("r", 1, 8, 128)],
    "two chains overlap": [("a", 1, 3, 0), ("a", 2, 3, 0), ("r", 1, 48), ("r", 2, 40)],
    "same chain twice": [("a", 1, 2, 0), ("a", 1, 4, 0), ("r", 1, 30), ("r", 1, 64)],
    "evict then refill": [("a", 1, 4, 0), ("r", 1, 64), ("a", 2, 4, 0), ("r", 2, 64),
                          ("a", 3, 3, 0), ("r", 3, 48), ("a", 1, 4, 0), ("r", 1, 64)],
    "pinned blocks refuse": [("a", 1, 3, 0), ("a", 2, 2, 0), ("r", 2, 32), ("r", 1, 48)],
    "release more tokens than held": [("a", 1, 2, 0), ("r", 1, 10 * B)],
}  # fmt: skip


@pytest.mark.parametrize("steps", SEQUENCES.values(), ids=SEQUENCES.keys())
@pytest.mark.parametrize("capacity", [1, 4, 5])
def test_used_never_exceeds_capacity(steps: list[tuple], capacity: int) -> None:
    c = cache(capacity=capacity)
    held: dict[int, int] = {}
    for step in steps:
        if step[0] == "a":
            _, chain, blocks, _ = step
            if c.acquire(chain, blocks):
                held[chain] = held.get(chain, 0) + 1
        elif held.get(step[1]):
            held[step[1]] -= 1
            c.release(step[1], step[2])
        assert 0 <= c.pinned <= c.used <= capacity
        assert sum(c.cached_blocks(chain) for chain in (1, 2, 3)) == c.used
