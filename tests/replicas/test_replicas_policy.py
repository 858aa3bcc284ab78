"""Bounded-load consistent hashing as pure functions: tables of cases and fleet properties."""

from __future__ import annotations

import random

import pytest

from kvmigrate.policies.replicas import HashRing, choose_replica, load_bound, ring_point

FOUR = ("http://r0/v1", "http://r1/v1", "http://r2/v1", "http://r3/v1")
KEYS = [f"conversation-{i}" for i in range(4000)]


@pytest.mark.parametrize(
    ("in_flight", "replicas", "factor", "expected"),
    [
        (0, 4, 1.25, 1),  # the first request always fits somewhere
        (3, 4, 1.25, 2),  # ceil(1.25 * 4 / 4)
        (15, 4, 1.25, 5),  # ceil(1.25 * 16 / 4): a quarter over the mean of 4
        (99, 4, 1.25, 32),  # ceil(31.25)
        (7, 4, 1.0, 2),  # c = 1: perfectly even
        (7, 4, 2.0, 4),
        (0, 1, 1.25, 2),
        (10, 3, 1.25, 5),  # ceil(1.25 * 11 / 3) = ceil(4.58)
    ],
)
def test_load_bound(in_flight: int, replicas: int, factor: float, expected: int) -> None:
    assert load_bound(in_flight, replicas, factor) == expected


@pytest.mark.parametrize(
    ("loads", "healthy", "expected_step"),
    [
        # expected_step: position in the key's clockwise walk of the replica that must serve
        ([0, 0, 0, 0], None, 0),  # idle fleet: the home replica
        ("home=5", None, 1),  # home at the bound: the next replica clockwise
        ("home=5,next=5", None, 2),  # both busy: the one after
        ([0, 0, 0, 0], "home", 1),  # home down: next clockwise
        ([0, 0, 0, 0], "home,next", 2),
        # home busy and next down: 3 live replicas make the bound ceil(1.25 * 16 / 3) = 7
        ("home=7", "next", 2),
        ("home=6", "next", 0),  # under that bound the home still serves
        ([0, 0, 0, 0], "all", 0),  # all down: home anyway (the call fails fast, fallback serves)
    ],
)
def test_choose_replica_walks_clockwise_past_busy_and_down_replicas(
    loads: list[int] | str, healthy: str | None, expected_step: int
) -> None:
    ring = HashRing.build(FOUR)
    key = "conversation-42"
    walk = list(ring.walk(key))
    assert sorted(walk) == [0, 1, 2, 3]
    load = [0, 0, 0, 0]
    if isinstance(loads, str):
        # 15 in flight elsewhere makes the bound 5 (see test_load_bound)
        for part in loads.split(","):
            role, value = part.split("=")
            load[walk[0] if role == "home" else walk[1]] = int(value)
        load[walk[3]] += 15 - sum(load)
    up = [True] * 4
    for role in (healthy or "").split(","):
        if role == "home":
            up[walk[0]] = False
        elif role == "next":
            up[walk[1]] = False
        elif role == "all":
            up = [False] * 4
    assert choose_replica(ring, key, load, up) == walk[expected_step]


def test_ring_points_are_stable_across_runs() -> None:
    # blake2b, not Python's salted hash(): every proxy replica and restart agrees.
    assert ring_point("conversation-1") == ring_point("conversation-1")
    assert HashRing.build(FOUR).home("abc") == HashRing.build(list(FOUR)).home("abc")


@pytest.mark.parametrize("replicas", [2, 3, 4, 8])
def test_shares_are_even_within_a_few_percent(replicas: int) -> None:
    ring = HashRing.build([f"http://r{i}/v1" for i in range(replicas)])
    counts = [0] * replicas
    for key in KEYS:
        counts[ring.home(key)] += 1
    mean = len(KEYS) / replicas
    assert max(counts) / mean < 1.15
    assert min(counts) / mean > 0.85


def test_a_failed_replica_moves_only_its_own_conversations() -> None:
    ring = HashRing.build(FOUR)
    before = {key: choose_replica(ring, key, [0] * 4) for key in KEYS}
    down = [True, False, True, True]
    after = {key: choose_replica(ring, key, [0] * 4, down) for key in KEYS}
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == 1}
    # and they spread over the others instead of piling onto one neighbour
    targets = [after[key] for key in moved]
    assert all(targets.count(i) > len(moved) / 6 for i in (0, 2, 3))


def test_adding_a_replica_moves_only_what_it_takes_over() -> None:
    old = HashRing.build(FOUR)
    new = HashRing.build([*FOUR, "http://r4/v1"])
    moved = [key for key in KEYS if old.home(key) != new.home(key)]
    assert all(new.home(key) == 4 for key in moved)
    assert 0.12 < len(moved) / len(KEYS) < 0.28  # about a fifth: the new replica's share


def test_hash_mod_n_would_move_most_conversations() -> None:
    """Why a ring: with hash mod N, one more replica remaps about 4 in 5 conversations."""
    moved = sum(1 for key in KEYS if ring_point(key) % 4 != ring_point(key) % 5)
    assert moved / len(KEYS) > 0.7


@pytest.mark.parametrize("factor", [1.0, 1.25, 2.0])
def test_no_replica_ever_exceeds_the_bound(factor: float) -> None:
    """Random arrivals and departures: after every placement the load stays within bound."""
    rng = random.Random(7)
    ring = HashRing.build(FOUR)
    loads = [0, 0, 0, 0]
    placed: list[int] = []
    for step in range(3000):
        if placed and rng.random() < 0.45:
            loads[placed.pop(rng.randrange(len(placed)))] -= 1
            continue
        bound = load_bound(sum(loads), 4, factor)
        index = choose_replica(ring, f"k{rng.randrange(50)}", loads, factor=factor)
        loads[index] += 1
        placed.append(index)
        assert loads[index] <= bound, step


def test_skewed_keys_spill_only_while_the_home_is_busy() -> None:
    """One hot conversation: its requests stay home until home holds the bound, then spill."""
    ring = HashRing.build(FOUR)
    home = ring.home("hot")
    loads = [0, 0, 0, 0]
    chosen = []
    for _ in range(12):
        index = choose_replica(ring, "hot", loads)
        loads[index] += 1
        chosen.append(index)
    assert chosen[0] == home
    assert loads[home] == max(loads)
    assert max(loads) <= load_bound(11, 4)


@pytest.mark.parametrize(
    ("replicas", "vnodes"),
    [([], 160), (["a", "a"], 160), (["a"], 0)],
)
def test_bad_rings_are_refused(replicas: list[str], vnodes: int) -> None:
    with pytest.raises(ValueError, match=r"replica|vnodes"):
        HashRing.build(replicas, vnodes)


def test_bad_inputs_are_refused() -> None:
    ring = HashRing.build(FOUR)
    with pytest.raises(ValueError, match="load factor"):
        load_bound(1, 4, 0.5)
    with pytest.raises(ValueError, match="one entry per replica"):
        choose_replica(ring, "k", [0, 0])
