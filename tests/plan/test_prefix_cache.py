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


def test_a_request_larger_than_the_cache_is_admitted_alone_when_forced() -> None:
    c = cache(capacity=4)
    assert not c.acquire(1, 8)
    assert c.acquire(1, 8, force=True)
    c.release(1, 8 * B)
    assert c.pinned == 0


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
