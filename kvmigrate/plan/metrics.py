"""What one simulated fleet size delivered: hit rate, TTFT by turn, queueing, and how hard
the replicas worked.

`any_step_running` is the share of time any step runs, however small: one sequence decoding alone
keeps a replica "active" while using a sliver of it, so it is no capacity figure. A
replica runs out of one of two things, and `utilisation` is the larger share used:
- compute: tokens computed (prompt tokens prefilled plus one per sequence per decode step)
  against what the replicas compute flat out, steps that fill the whole token budget with
  new prompt tokens (`peak_tokens_s`); prefill-heavy traffic runs out of this;
- KV cache: blocks held by running requests against the cache's blocks, over time; many
  long conversations decoding at once run out of this first (cached blocks of finished
  requests do not count: they are evicted on demand).

Requests refused for being larger than a replica's KV cache are counted, and left out of
the TTFT, queueing and hit-rate figures, which describe the requests that ran; when none
ran, the TTFT figures are infinite, so no SLO is met.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kvmigrate.percentile import percentiles
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
    any_step_running: float  # mean share of the simulated time the replicas ran any step
    utilisation: float  # the larger of the two below: the binding resource's share
    compute: float  # tokens computed / (peak tokens per second x time x replicas)
    kv_held: float  # KV blocks held by running requests / (blocks x time x replicas)
    evicted_blocks: int
    turns: tuple[TurnFigures, ...]
    refused: int = 0  # requests larger than a replica's whole KV cache


def _p50_p95(values: Sequence[float]) -> tuple[float, float]:
    p50, p95 = (math.inf if p is None else p for p in percentiles(values, (50, 95)))
    return p50, p95


def _hit(jobs: Sequence[Job]) -> float:
    prompt = sum(j.request.prompt_tokens for j in jobs)
    return sum(j.cached for j in jobs) / prompt if prompt else 0.0


def _turn_key(turn: int) -> int:
    return min(max(turn, 1), TURN_ROWS)


def figures(outcome: Outcome) -> FleetFigures:
    jobs = [j for j in outcome.jobs if not j.refused]
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
        turns.append(TurnFigures(label, len(group), *_p50_p95(values), _hit(group)))
    capacity = (outcome.end_s or 1.0) * outcome.replicas
    peak = outcome.peak_tokens_s
    compute = sum(outcome.tokens) / (peak * capacity) if peak > 0 else 0.0
    kv = sum(outcome.held_block_s) / (outcome.kv_blocks * capacity) if outcome.kv_blocks else 0.0
    ttft_p50, ttft_p95 = _p50_p95(ttfts)
    queue_p50, queue_p95 = _p50_p95(queue)
    return FleetFigures(
        replicas=outcome.replicas,
        requests=len(outcome.jobs),
        hit_rate=_hit(jobs),
        ttft_p50_s=ttft_p50,
        ttft_p95_s=ttft_p95,
        queue_p50_s=queue_p50,
        queue_p95_s=queue_p95,
        any_step_running=sum(outcome.busy_s) / capacity,
        utilisation=max(compute, kv),
        compute=compute,
        kv_held=kv,
        evicted_blocks=outcome.evictions,
        turns=tuple(turns),
        refused=len(outcome.jobs) - len(jobs),
    )
