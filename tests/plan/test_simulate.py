"""The fleet simulation on a synthetic multi-turn agent workload."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.metrics import FleetFigures, figures
from kvmigrate.plan.simulate import Fleet, simulate
from kvmigrate.plan.synthetic import agent_workload
from kvmigrate.plan.workload import Workload, scaled

WORKLOAD = agent_workload(conversations=120, turns=8, conversations_per_s=1.5, seed=7)


def run(workload: Workload = WORKLOAD, replicas: int = 4, **fleet: object) -> FleetFigures:
    settings = Fleet(kv_blocks=40_000, cost=CostModel(), **fleet)  # type: ignore[arg-type]
    return figures(simulate(workload, settings, replicas))


def test_every_request_is_served_once_and_each_turn_after_the_one_before() -> None:
    outcome = simulate(WORKLOAD, Fleet(kv_blocks=40_000, cost=CostModel()), 3)
    assert len(outcome.jobs) == len(WORKLOAD.requests)
    assert {(j.request.conversation, j.request.turn) for j in outcome.jobs} == {
        (r.conversation, r.turn) for r in WORKLOAD.requests
    }
    by_conversation = defaultdict(list)
    for j in outcome.jobs:
        assert j.arrival <= j.admitted_at <= j.first_token_at <= j.finished_at
        by_conversation[j.request.conversation].append(j)
    for jobs in by_conversation.values():
        jobs.sort(key=lambda j: j.request.turn)
        for before, after in itertools.pairwise(jobs):
            assert after.arrival >= before.finished_at
        assert len({j.replica for j in jobs}) == 1  # affinity: one replica per conversation


def test_prefix_caching_lowers_ttft_on_every_later_turn() -> None:
    on, off = run(), run(prefix_caching=False)
    assert on.hit_rate > 0.7
    assert off.hit_rate == 0
    for with_cache, without in zip(on.turns[1:], off.turns[1:], strict=True):
        assert with_cache.ttft_p50_s < without.ttft_p50_s
    # Without the cache every turn recomputes a longer history: TTFT grows with the turn.
    assert off.turns[-1].ttft_p50_s > 2 * off.turns[0].ttft_p50_s
    # With it, a later turn computes only its new message: faster than the cold first one.
    assert on.turns[-1].ttft_p50_s < on.turns[0].ttft_p50_s


@pytest.mark.parametrize("other", ["round-robin", "least-loaded"])
def test_scattering_a_conversation_lowers_the_fleet_hit_rate(other: str) -> None:
    affinity, scattered = run(routing="affinity"), run(routing=other)
    assert scattered.hit_rate < affinity.hit_rate - 0.2
    assert scattered.ttft_p50_s > affinity.ttft_p50_s


def test_one_replica_sees_every_conversation_whatever_the_routing() -> None:
    assert run(replicas=1, routing="round-robin").hit_rate == run(replicas=1).hit_rate


def test_a_small_cache_evicts_and_hits_less() -> None:
    small = figures(simulate(WORKLOAD, Fleet(kv_blocks=800, cost=CostModel()), 2))
    large = run(replicas=2)
    assert small.evicted_blocks > 0
    assert small.hit_rate < large.hit_rate


def test_doubling_the_traffic_queues_more_on_a_small_fleet() -> None:
    base = run(replicas=1)
    doubled = run(scaled(WORKLOAD, rate=4.0), replicas=1)
    assert doubled.queue_p95_s > base.queue_p95_s
    assert doubled.ttft_p95_s > base.ttft_p95_s


def test_longer_contexts_take_longer_to_prefill() -> None:
    assert run(scaled(WORKLOAD, context=4.0)).turns[0].ttft_p50_s > run().turns[0].ttft_p50_s
