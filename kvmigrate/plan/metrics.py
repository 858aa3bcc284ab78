"""What one simulated fleet size delivered: hit rate, TTFT by turn, queueing, busy share."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kvmigrate.percentile import percentile
from kvmigrate.plan.scheduler import Job
from kvmigrate.plan.simulate import Outcome

TURN_ROWS = 10  # turns past this are reported together as the last row ("10+")


@dataclass(frozen=True, slots=True)
class TurnFigures:
    turn: str  # "1".."9", "10+"
    requests: int
    ttft_p50_s: float
    ttft_p95_s: float
    hit_rate: float  # cached prompt tokens / prompt tokens


@dataclass(frozen=True, slots=True)
class FleetFigures:
    replicas: int
    requests: int
    hit_rate: float
    ttft_p50_s: float
    ttft_p95_s: float
    queue_p50_s: float
    queue_p95_s: float
    busy: float  # mean share of the simulated time the replicas spent running steps
    evicted_blocks: int
    turns: tuple[TurnFigures, ...]


def _p(values: Sequence[float], q: float) -> float:
    return percentile(values, q) or 0.0


def _hit(jobs: Sequence[Job]) -> float:
    prompt = sum(j.request.prompt_tokens for j in jobs)
    return sum(j.cached for j in jobs) / prompt if prompt else 0.0


def _turn_key(turn: int) -> int:
    return min(max(turn, 1), TURN_ROWS)


def figures(outcome: Outcome) -> FleetFigures:
    jobs = outcome.jobs
    ttfts = [j.first_token_at - j.arrival for j in jobs]
    queue = [j.admitted_at - j.arrival for j in jobs]
    by_turn: dict[int, list[Job]] = defaultdict(list)
    for job in jobs:
        by_turn[_turn_key(job.request.turn)].append(job)
    turns = []
    for key in sorted(by_turn):
        group = by_turn[key]
        values = [j.first_token_at - j.arrival for j in group]
        label = f"{key}+" if key == TURN_ROWS else str(key)
        turns.append(TurnFigures(label, len(group), _p(values, 50), _p(values, 95), _hit(group)))
    span = outcome.end_s or 1.0
    return FleetFigures(
        replicas=outcome.replicas,
        requests=len(jobs),
        hit_rate=_hit(jobs),
        ttft_p50_s=_p(ttfts, 50),
        ttft_p95_s=_p(ttfts, 95),
        queue_p50_s=_p(queue, 50),
        queue_p95_s=_p(queue, 95),
        busy=sum(outcome.busy_s) / (span * outcome.replicas),
        evicted_blocks=outcome.evictions,
        turns=tuple(turns),
    )
