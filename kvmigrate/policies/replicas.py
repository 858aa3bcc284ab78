"""Which replica serves a conversation: consistent hashing with bounded loads.

A replica's prefix cache only helps the conversations that keep coming back to it, so every
turn of a conversation should land on the same replica. Plain `hash mod N` does that until
the replica count changes, when almost every conversation moves and every cache goes cold.
A hash ring with virtual nodes moves only the conversations of a replica that leaves.

Hashing alone can overload a replica that happens to own many busy conversations. The
bounded-load variant (Mirrokni, Thorup and Zadimoghaddam, 2018; used by vllm-router and
llm-d) caps every replica at `ceil(c * (m + 1) / n)` units of load, where m is the fleet's
current load and n the number of replicas: a key whose home replica is at the cap walks on
clockwise to the next replica under it. With c = 1.25 no replica carries more than a
quarter over the mean.

What a unit of load is belongs to the caller. The proxy counts active conversations (see
`kvmigrate.proxy.replicas`): a conversation is placed once, under the bound, and keeps its
replica for its whole life, so the bound never splits a conversation across two caches.

Everything here is pure: the proxy side owns the loads and the health state.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

LOAD_FACTOR = 1.25
# 160 points per replica keep the share a replica owns within a few percent of 1/n
# (ketama's default); the ring is built once per replica list, so the size is cheap.
VIRTUAL_NODES = 160


def ring_point(text: str) -> int:
    """A 64-bit position on the ring; blake2b, so it is stable across processes and runs."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class HashRing:
    """Replicas placed at `vnodes` points each; a key belongs to the next point clockwise."""

    replicas: tuple[str, ...]
    points: tuple[int, ...]
    owners: tuple[int, ...]  # owners[i] is the replica index at points[i]

    @classmethod
    def build(cls, replicas: Sequence[str], vnodes: int = VIRTUAL_NODES) -> HashRing:
        if not replicas:
            raise ValueError("a hash ring needs at least one replica")
        if len(set(replicas)) != len(replicas):
            raise ValueError("replica names must be unique")
        if vnodes < 1:
            raise ValueError("vnodes must be >= 1")
        # A replica's points depend only on its own name, so adding or removing one replica
        # leaves every other replica's arcs (and conversations) where they were.
        placed = sorted(
            (ring_point(f"{name}#{v}"), index)
            for index, name in enumerate(replicas)
            for v in range(vnodes)
        )
        return cls(
            replicas=tuple(replicas),
            points=tuple(p for p, _ in placed),
            owners=tuple(i for _, i in placed),
        )

    def walk(self, key: str) -> Iterator[int]:
        """Replica indices in ring order from the key's position, each once."""
        start = bisect.bisect_right(self.points, ring_point(key))
        seen: set[int] = set()
        count = len(self.points)
        for step in range(count):
            owner = self.owners[(start + step) % count]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self.replicas):
                    return

    def home(self, key: str) -> int:
        """The replica a key belongs to when every replica is up and none is loaded."""
        return next(self.walk(key))


def load_bound(load: int, replicas: int, factor: float = LOAD_FACTOR) -> int:
    """The most load one replica may hold once the new unit is placed: ceil(c*(m+1)/n)."""
    if replicas < 1:
        raise ValueError("need at least one replica")
    if factor < 1.0:
        raise ValueError("the load factor must be >= 1")
    return max(1, math.ceil(factor * (load + 1) / replicas))


def choose_replica(
    ring: HashRing,
    key: str,
    loads: Sequence[int],
    healthy: Sequence[bool] | None = None,
    factor: float = LOAD_FACTOR,
) -> int:
    """The first healthy replica clockwise from `key` whose load is under the bound.

    `loads[i]` is replica i's load, `healthy[i]` whether it is up (default:
    all). The bound counts only healthy replicas and their load, because the down ones take
    no new work. With no replica healthy, the key's home is returned: the call will fail
    fast and the proxy's fallback takes over, which beats refusing on stale health state.
    """
    up = healthy if healthy is not None else [True] * len(ring.replicas)
    if len(loads) != len(ring.replicas) or len(up) != len(ring.replicas):
        raise ValueError("loads and healthy must have one entry per replica")
    live = [i for i, ok in enumerate(up) if ok]
    if not live:
        return ring.home(key)
    bound = load_bound(sum(loads[i] for i in live), len(live), factor)
    for index in ring.walk(key):
        if up[index] and loads[index] < bound:
            return index
    # Unreachable for factor >= 1 (some live replica is always under the bound); kept so a
    # caller passing inconsistent loads still gets an answer.
    return min(live, key=lambda i: loads[i])
