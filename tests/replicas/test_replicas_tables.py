"""The hash ring's fixed points and edges: ring positions that must not change between
versions (proxies of two releases behind one load balancer must place a conversation on the
same replica), the clockwise walk, one virtual node, and the exact refusals."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable

import pytest

from kvmigrate.policies.replicas import HashRing, choose_replica, load_bound, ring_point


@pytest.mark.parametrize(
    ("text", "point"),
    [
        ("conversation-1", 7303399821250189476),
        ("r0#0", 17876365534358666919),
        ("", 16476032584258269876),
    ],
)
def test_ring_points_are_stable_across_releases(text: str, point: int) -> None:
    assert ring_point(text) == point


@pytest.mark.parametrize("key", [f"conversation {i}" for i in range(20)])
def test_the_walk_goes_clockwise_from_the_key(key: str) -> None:
    ring = HashRing.build(["r0", "r1", "r2"], vnodes=4)
    start = bisect.bisect_right(ring.points, ring_point(key))
    clockwise = [ring.owners[(start + i) % len(ring.points)] for i in range(len(ring.points))]
    expected = list(dict.fromkeys(clockwise))  # each replica at its first point clockwise
    assert list(ring.walk(key)) == expected
    assert ring.home(key) == expected[0]


def test_one_virtual_node_per_replica_is_a_ring() -> None:
    ring = HashRing.build(["a", "b"], vnodes=1)
    assert len(ring.points) == 2
    assert sorted(ring.owners) == [0, 1]
    assert sorted(ring.walk("k")) == [0, 1]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: HashRing.build([]), "a hash ring needs at least one replica"),
        (lambda: HashRing.build(["a", "a"]), "replica names must be unique"),
        (lambda: HashRing.build(["a"], vnodes=0), "vnodes must be >= 1"),
        (lambda: load_bound(3, 0), "need at least one replica"),
        (lambda: load_bound(3, 2, factor=0.99), "the load factor must be >= 1"),
        (
            lambda: choose_replica(HashRing.build(["a", "b"]), "k", [0]),
            "loads and healthy must have one entry per replica",
        ),
        (
            lambda: choose_replica(HashRing.build(["a", "b"]), "k", [0, 0], [True]),
            "loads and healthy must have one entry per replica",
        ),
    ],
)
def test_refusals_say_why(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()
