"""The discrete-event loop: a recorded workload through a simulated fleet.

Events are arrivals and the ends of engine steps, in time order. A conversation's first
turn arrives at its recorded time; each later turn arrives its recorded think time after
the simulated answer to the turn before (a slower fleet delays the user's next turn, as it
would in life), or at its recorded time when that think time is unknown.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict, deque
from dataclasses import dataclass, field

from kvmigrate.plan.cost_model import CostModel, attention_pairs
from kvmigrate.plan.prefix_cache import PrefixCache
from kvmigrate.plan.routing import router
from kvmigrate.plan.scheduler import Engine, EngineSettings, Job
from kvmigrate.plan.workload import Request, Workload


@dataclass(frozen=True, slots=True)
class Fleet:
    """Everything about the simulated fleet but its size."""

    kv_blocks: int  # per replica
    cost: CostModel
    engine: EngineSettings = field(default_factory=EngineSettings)
    routing: str = "affinity"
    prefix_caching: bool = True


@dataclass(frozen=True, slots=True)
class Outcome:
    """The simulated jobs (every request once, in completion order) and the engines."""

    replicas: int
    jobs: tuple[Job, ...]
    busy_s: tuple[float, ...]
    evictions: int
    end_s: float
    tokens: tuple[int, ...] = ()  # computed per replica (prefilled + decoded)
    held_block_s: tuple[float, ...] = ()  # KV blocks held by running requests x time
    kv_blocks: int = 0  # per replica
    peak_tokens_s: float = 0.0  # what one replica computes flat out (see `peak_tokens_s`)


def peak_tokens_s(fleet: Fleet) -> float:
    """Tokens a replica computes per second flat out: steps that fill the whole token
    budget with new prompt tokens. Utilisation is tokens computed against this."""
    budget = fleet.engine.max_batched_tokens
    return budget / fleet.cost.step_s(budget, 0, 0, attention_pairs(0, budget))


_STEP, _ARRIVE = 0, 1  # at equal times a step ends (freeing room) before an arrival lands


Event = tuple[float, int, int, Request | None, int, int]  # time, kind, n, arrival, replica, version


class _Loop:
    """The simulation's state: the engines, the router, and the events still to come."""

    def __init__(self, workload: Workload, fleet: Fleet, replicas: int) -> None:
        cache = (fleet.kv_blocks, fleet.engine.block_size, fleet.prefix_caching)
        self.engines = [
            Engine(PrefixCache(*cache), fleet.cost, fleet.engine) for _ in range(replicas)
        ]
        self.route = router(fleet.routing, replicas)
        self.versions = [0] * replicas  # a step's end event is stale once its version moved
        self.later: dict[str, deque[Request]] = defaultdict(deque)
        self.order = itertools.count()
        self.events: list[Event] = []
        for request in workload.requests:
            if request.gap_s is None:
                self.events.append((request.arrival_s, _ARRIVE, next(self.order), request, 0, 0))
            else:
                self.later[request.conversation].append(request)
        heapq.heapify(self.events)
        self.done: list[Job] = []

    def schedule(self, index: int, end: float | None) -> None:
        self.versions[index] += 1
        if end is not None:
            event = (end, _STEP, next(self.order), None, index, self.versions[index])
            heapq.heappush(self.events, event)

    def arrive(self, request: Request, now: float) -> None:
        index = self.route.choose(request.conversation, self.engines)
        engine = self.engines[index]
        job = Job(request, now, index)
        if engine.refuses(request):
            # An error answer at once; the conversation goes on (a client retries shorter).
            job.refused = True
            job.finished_at = now
            self.complete(job)
            return
        engine.waiting.append(job)
        if engine.step is None:
            self.schedule(index, engine.start(now))
        else:
            cut = engine.cut(now)
            if cut is not None:
                self.schedule(index, cut)

    def complete(self, job: Job) -> None:
        """A job answered (or refused): its conversation's next turn comes after its think time."""
        self.done.append(job)
        following = self.later.get(job.request.conversation)
        if following:
            nxt = following.popleft()
            arrival = job.finished_at + (nxt.gap_s or 0.0)
            heapq.heappush(self.events, (arrival, _ARRIVE, next(self.order), nxt, 0, 0))
        else:
            self.route.ended(job.request.conversation)

    def step_ends(self, index: int, now: float) -> None:
        engine = self.engines[index]
        for job in engine.finish(now):
            self.complete(job)
        self.schedule(index, engine.start(now))


def simulate(workload: Workload, fleet: Fleet, replicas: int) -> Outcome:
    if replicas < 1:
        raise ValueError("need at least one replica")
    loop = _Loop(workload, fleet, replicas)
    now = 0.0
    while loop.events:
        now, _, _, request, index, version = heapq.heappop(loop.events)
        if request is not None:
            loop.arrive(request, now)
        elif version == loop.versions[index]:  # else: a decode stretch an arrival cut short
            loop.step_ends(index, now)
    return Outcome(
        replicas=replicas,
        jobs=tuple(loop.done),
        busy_s=tuple(e.busy_s for e in loop.engines),
        evictions=sum(e.cache.evictions for e in loop.engines),
        end_s=now,
        tokens=tuple(e.tokens for e in loop.engines),
        held_block_s=tuple(e.held_block_s for e in loop.engines),
        kv_blocks=fleet.kv_blocks,
        peak_tokens_s=peak_tokens_s(fleet),
    )
