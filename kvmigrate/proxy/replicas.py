"""The replicas of one backend: which one a conversation goes to, their load and their health.

- Placement: bounded-load consistent hashing on the conversation key
  (`kvmigrate.policies.replicas`), where a replica's load is the number of conversations
  it holds that were active within `session_ttl_s`. A conversation is placed on its first
  turn (or after it went idle) and then keeps its replica, so every turn reaches the cache
  that holds its prefix. Counting requests in flight instead would move a conversation for
  one turn whenever its replica is momentarily busy, and each such turn is a cold prefill.
- In-flight requests per replica are counted too (`loads`): `Upstream.send` takes a lease
  when a call starts and the answer's close ends it (reading it to the end closes it).
  That covers serve and shadow calls alike, with nothing to forget on an error path. They
  are reported, and steer requests that belong to no conversation.
- Health: a replica that refuses connections is marked down at once (passive check); its
  conversations are placed again on their next turn, on the next replica clockwise, and the
  others stay where they are. A probe asks its `/models` every `probe_interval_s` and marks
  it up on the first answer below 500; new conversations reach it again, while the moved
  ones stay on the replica that now caches them until they go idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import aiohttp

from kvmigrate.config import safe_url
from kvmigrate.policies.replicas import LOAD_FACTOR, VIRTUAL_NODES, HashRing, choose_replica

log = logging.getLogger("kvmigrate.proxy")

Strategy = Literal["bounded_hash", "round_robin"]
STRATEGIES: tuple[Strategy, ...] = ("bounded_hash", "round_robin")


class _Lease:
    """One request's share of a replica's load, released exactly once."""

    def __init__(self, replicas: ReplicaSet, index: int) -> None:
        self._replicas = replicas
        self.index = index
        self._open = True

    def release(self) -> None:
        if self._open:
            self._open = False
            self._replicas.loads[self.index] -= 1


class ReplicaSet:
    """The replica base URLs of one backend with their in-flight load and health."""

    def __init__(
        self,
        bases: Sequence[str],
        *,
        strategy: Strategy = "bounded_hash",
        load_factor: float = LOAD_FACTOR,
        vnodes: int = VIRTUAL_NODES,
        probe_interval_s: float = 2.0,
        probe_timeout_s: float = 2.0,
        probe_headers: Mapping[str, str] | None = None,
        probe_url: Callable[[str], str] = lambda base: base + "/models",
        session_ttl_s: float = 300.0,
        max_sessions: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")
        self.bases = tuple(bases)
        self.strategy: Strategy = strategy
        self.load_factor = load_factor
        self.loads = [0] * len(self.bases)
        self.healthy = [True] * len(self.bases)
        self.probe_interval_s = probe_interval_s
        self._probe_timeout_s = probe_timeout_s
        self._probe_headers = dict(probe_headers or {})
        self._probe_url = probe_url
        self._ring = HashRing.build(_unique_names(self.bases), vnodes)
        self._turns = itertools.count()
        self._probes: dict[int, asyncio.Task[None]] = {}
        # conversation -> (replica index, last seen), oldest first: expiry pops from the front.
        self._sessions: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.sessions = [0] * len(self.bases)  # active conversations per replica
        self.session_ttl_s = session_ttl_s
        self._max_sessions = max_sessions
        self._clock = clock

    @property
    def multiple(self) -> bool:
        return len(self.bases) > 1

    def pick(self, conversation: str = "") -> str:
        """The base URL for a request of `conversation` (empty: not part of one)."""
        if not self.multiple:
            return self.bases[0]
        live = [i for i, ok in enumerate(self.healthy) if ok] or list(range(len(self.bases)))
        if self.strategy == "round_robin":
            return self.bases[live[next(self._turns) % len(live)]]
        if not conversation:
            # Nothing is cached for a request outside a conversation: the least loaded serves.
            return self.bases[min(live, key=lambda i: self.loads[i])]
        return self.bases[self._place(conversation)]

    def _place(self, conversation: str) -> int:
        now = self._clock()
        self._expire(now)
        held = self._sessions.pop(conversation, None)
        if held is not None and self.healthy[held[0]]:
            index = held[0]
        else:
            if held is not None:
                self.sessions[held[0]] -= 1  # its replica is down: place it again
            index = choose_replica(
                self._ring, conversation, self.sessions, self.healthy, self.load_factor
            )
            self.sessions[index] += 1
        self._sessions[conversation] = (index, now)
        return index

    def _expire(self, now: float) -> None:
        while self._sessions:
            conversation, (index, seen) = next(iter(self._sessions.items()))
            if now - seen <= self.session_ttl_s and len(self._sessions) < self._max_sessions:
                return
            del self._sessions[conversation]
            self.sessions[index] -= 1

    def assigned(self, conversation: str) -> str | None:
        """The replica holding an active conversation, or None."""
        held = self._sessions.get(conversation)
        return None if held is None else self.bases[held[0]]

    def home(self, conversation: str) -> str:
        """The replica a conversation belongs to when all are up and idle."""
        return self.bases[self._ring.home(conversation)]

    def index_of(self, url: str) -> int | None:
        """Which replica a request URL goes to; the longest matching base wins."""
        best: int | None = None
        for index, base in enumerate(self.bases):
            under = url == base or url.startswith(base.rstrip("/") + "/")
            if under and (best is None or len(base) > len(self.bases[best])):
                best = index
        return best

    # -- load: each upstream call holds a lease on its replica until its answer closes ----

    def lease(self, url: str) -> _Lease | None:
        """Count a call to `url` as its replica's load; none for a single replica (nothing
        to pick between)."""
        if not self.multiple:
            return None
        index = self.index_of(url)
        if index is None:
            return None
        self.loads[index] += 1
        return _Lease(self, index)

    # -- health ----------------------------------------------------------------------------

    def mark_down(self, index: int) -> None:
        """Take a replica out of rotation and probe it until it answers again."""
        if self.healthy[index]:
            log.warning("replica %s is down; its conversations move", safe_url(self.bases[index]))
        self.healthy[index] = False
        if index not in self._probes:
            task = asyncio.get_running_loop().create_task(self._probe_until_up(index))
            self._probes[index] = task

    def mark_up(self, index: int) -> None:
        if not self.healthy[index]:
            log.warning("replica %s is back", safe_url(self.bases[index]))
        self.healthy[index] = True

    async def _probe_until_up(self, index: int) -> None:
        timeout = aiohttp.ClientTimeout(total=self._probe_timeout_s)
        url = self._probe_url(self.bases[index])
        try:
            # Its own small session: probe calls must not count as load or trip the hooks.
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while not self.healthy[index]:
                    await asyncio.sleep(self.probe_interval_s)
                    if await _answers(session, url, self._probe_headers):
                        self.mark_up(index)
        finally:
            self._probes.pop(index, None)

    async def close(self) -> None:
        probes = list(self._probes.values())
        for task in probes:
            task.cancel()
        for task in probes:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _answers(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> bool:
    """Whether the replica answers at all: a 401 or 404 still proves it is up."""
    try:
        async with session.get(url, headers=headers) as response:
            await response.read()
            return response.status < 500
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


def _unique_names(bases: Sequence[str]) -> list[str]:
    """Ring names: the URL itself, so a replica keeps its arcs when others come or go; a
    URL listed twice gets a suffix (twice the share, as the config asked)."""
    seen: dict[str, int] = {}
    names = []
    for base in bases:
        count = seen.get(base, 0)
        seen[base] = count + 1
        names.append(base if count == 0 else f"{base}#{count}")
    return names
