"""Which replica a simulated request goes to: the proxy's policy, or the what-if ones.

- `affinity`: kvmigrate's consistent hashing with bounded loads
  (`kvmigrate.policies.replicas`), placing each conversation once, under the bound on
  active conversations, as the proxy does; it keeps that replica for its whole life.
- `round-robin`: each request to the next replica, as a plain load balancer does; the
  turns of one conversation scatter, and with them its cache.
- `least-loaded`: each request to the replica with the fewest requests in flight.
"""

from __future__ import annotations

from typing import Protocol

from kvmigrate.plan.scheduler import Engine
from kvmigrate.policies.replicas import HashRing, choose_replica

ROUTINGS = ("affinity", "round-robin", "least-loaded")


class Router(Protocol):
    def choose(self, conversation: str, engines: list[Engine]) -> int: ...

    def ended(self, conversation: str) -> None:
        """The conversation's last turn finished."""


class Affinity:
    def __init__(self, replicas: int) -> None:
        self._ring = HashRing.build([f"replica-{i}" for i in range(replicas)])
        self._placed: dict[str, int] = {}
        self._loads = [0] * replicas

    def choose(self, conversation: str, engines: list[Engine]) -> int:
        index = self._placed.get(conversation)
        if index is None:
            index = choose_replica(self._ring, conversation, self._loads)
            self._placed[conversation] = index
            self._loads[index] += 1
        return index

    def ended(self, conversation: str) -> None:
        index = self._placed.pop(conversation, None)
        if index is not None:
            self._loads[index] -= 1


class RoundRobin:
    def __init__(self, replicas: int) -> None:
        self._replicas = replicas
        self._next = 0

    def choose(self, conversation: str, engines: list[Engine]) -> int:
        index = self._next
        self._next = (index + 1) % self._replicas
        return index

    def ended(self, conversation: str) -> None:
        return None


class LeastLoaded:
    def choose(self, conversation: str, engines: list[Engine]) -> int:
        return min(range(len(engines)), key=lambda i: engines[i].outstanding)

    def ended(self, conversation: str) -> None:
        return None


def router(name: str, replicas: int) -> Router:
    if name == "affinity":
        return Affinity(replicas)
    if name == "round-robin":
        return RoundRobin(replicas)
    if name == "least-loaded":
        return LeastLoaded()
    raise ValueError(f"unknown routing {name!r}; choose from {', '.join(ROUTINGS)}")
