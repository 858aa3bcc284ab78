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

from kvmigrate.plan.cost_model import CostModel
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


_STEP, _ARRIVE = 0, 1  # at equal times a step ends (freeing room) before an arrival lands


def simulate(workload: Workload, fleet: Fleet, replicas: int) -> Outcome:
    if replicas < 1:
        raise ValueError("need at least one replica")
    engines = [
        Engine(
            PrefixCache(fleet.kv_blocks, fleet.engine.block_size, fleet.prefix_caching),
            fleet.cost,
            fleet.engine,
        )
        for _ in range(replicas)
    ]
    route = router(fleet.routing, replicas)
    versions = [0] * replicas
    later: dict[str, deque[Request]] = defaultdict(deque)
    events: list[tuple[float, int, int, Request | None, int, int]] = []
    order = itertools.count()
    for request in workload.requests:
        if request.gap_s is None:
            events.append((request.arrival_s, _ARRIVE, next(order), request, 0, 0))
        else:
            later[request.conversation].append(request)
    heapq.heapify(events)
    done: list[Job] = []

    def schedule(index: int, end: float | None) -> None:
        versions[index] += 1
        if end is not None:
            heapq.heappush(events, (end, _STEP, next(order), None, index, versions[index]))

    now = 0.0
    while events:
        now, _, _, payload, index, version = heapq.heappop(events)
        if payload is not None:
            index = route.choose(payload.conversation, engines)
            engine = engines[index]
            engine.waiting.append(Job(payload, now, index))
            if engine.step is None:
                schedule(index, engine.start(now))
            else:
                cut = engine.cut(now)
                if cut is not None:
                    schedule(index, cut)
            continue
        if version != versions[index]:
            continue  # a stretch of decode steps cut short by an arrival
        engine = engines[index]
        for job in engine.finish(now):
            done.append(job)
            following = later.get(job.request.conversation)
            if following:
                nxt = following.popleft()
                arrival = job.finished_at + (nxt.gap_s or 0.0)
                heapq.heappush(events, (arrival, _ARRIVE, next(order), nxt, 0, 0))
            else:
                route.ended(job.request.conversation)
        schedule(index, engine.start(now))
    return Outcome(
        replicas=replicas,
        jobs=tuple(done),
        busy_s=tuple(e.busy_s for e in engines),
        evictions=sum(e.cache.evictions for e in engines),
        end_s=now,
    )
