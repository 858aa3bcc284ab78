"""What a plan says to buy: requests too large for a replica refused and counted, the
utilisation figure against the busy share, and the headroom above the SLO's fleet."""

from __future__ import annotations

import math

import pytest

from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.metrics import figures
from kvmigrate.plan.simulate import Fleet, simulate
from kvmigrate.plan.sweep import Costs, sweep, with_headroom
from kvmigrate.plan.tables import band_words, verdict
from kvmigrate.plan.workload import Request, Workload, chain_id

# Round figures, so each step's duration is exact arithmetic.
COST = CostModel(
    overhead_s=0.01, prefill_token_s=0.001, cached_token_s=0.0001, decode_seq_s=0.002, request_s=0
)
BUDGET = 8192


def request(conversation: str, turn: int, prompt: int, output: int, at: float = 0.0) -> Request:
    gap = None if turn == 1 else 0.0
    return Request(conversation, turn, at, prompt, output, chain_id(conversation, 0), gap)


def workload(*requests: Request) -> Workload:
    return Workload(tuple(requests), "test", basis_s=1.0)


def test_a_request_larger_than_the_cache_is_refused_and_caches_nothing() -> None:
    """10 blocks of 16 hold 160 tokens: 200 + 10 needs 14 blocks, so vLLM refuses it, and
    its next turn (larger still) too; the small conversation runs as if alone."""
    fleet = Fleet(kv_blocks=10, cost=COST)
    w = workload(request("big", 1, 200, 10), request("big", 2, 300, 10), request("s", 1, 100, 11))
    outcome = simulate(w, fleet, 1)
    refused = sorted((j.request.conversation, j.request.turn) for j in outcome.jobs if j.refused)
    assert refused == [("big", 1), ("big", 2)]
    got = figures(outcome)
    assert (got.requests, got.refused) == (3, 2)
    assert got.hit_rate == 0  # nothing of the refused conversation was cached
    assert got.ttft_p50_s == pytest.approx(0.01 + 100 * 0.001)  # the small one's prefill step
    assert outcome.evictions == 0


def test_when_every_request_is_refused_no_slo_is_met() -> None:
    fleet = Fleet(kv_blocks=1, cost=COST)
    got = figures(simulate(workload(request("big", 1, 200, 10)), fleet, 1))
    assert got.refused == 1
    assert math.isinf(got.ttft_p95_s)


def test_utilisation_is_tokens_computed_against_full_budget_steps() -> None:
    """One request, 100 prompt tokens and 11 output: a 0.11 s prefill step, then 10 decode
    steps of 0.012 s. The replica ran a step the whole 0.23 s ("any step running" 100%),
    yet computed 110 tokens where full 8,192-token steps (8.202 s each) compute
    8,192 / 8.202 tokens a second."""
    fleet = Fleet(kv_blocks=1000, cost=COST)
    outcome = simulate(workload(request("c", 1, 100, 11)), fleet, 1)
    got = figures(outcome)
    end = 0.11 + 10 * 0.012
    assert outcome.end_s == pytest.approx(end)
    assert got.any_step_running == pytest.approx(1.0)
    peak = BUDGET / (0.01 + BUDGET * 0.001)
    assert got.compute == pytest.approx(110 / (peak * end))
    # Its 111 tokens hold 7 blocks of 16, of 1,000, the whole time.
    assert got.kv_held == pytest.approx(7 / 1000)
    assert got.utilisation == got.compute


def test_kv_cache_held_is_the_utilisation_when_it_binds() -> None:
    """Two requests of 100 + 60 tokens (10 blocks each) in a 20-block cache: both decode
    together, the cache full, while the token budget is nearly idle. The first arrival
    starts a step alone (0.11 s, 10 blocks); the second prefills beside its first decode
    (0.01 + 0.1 + 0.002 s, 20 blocks); 58 steps decode both (0.014 s, 20 blocks); the
    last decodes the second alone (0.012 s, 10 blocks)."""
    fleet = Fleet(kv_blocks=20, cost=COST)
    got = figures(simulate(workload(request("a", 1, 100, 60), request("b", 1, 100, 60)), fleet, 1))
    end = 0.11 + 0.112 + 58 * 0.014 + 0.012
    held = 10 * 0.11 + 20 * 0.112 + 20 * 58 * 0.014 + 10 * 0.012
    assert got.kv_held == pytest.approx(held / (20 * end))
    tokens = 100 + (100 + 1) + 58 * 2 + 1
    assert got.compute == pytest.approx(tokens / (BUDGET / 8.202 * end))
    assert got.utilisation == got.kv_held


def test_a_second_idle_replica_halves_both_shares() -> None:
    fleet = Fleet(kv_blocks=1000, cost=COST)
    one = figures(simulate(workload(request("c", 1, 100, 11)), fleet, 1))
    two = figures(simulate(workload(request("c", 1, 100, 11)), fleet, 2))
    assert two.any_step_running == pytest.approx(one.any_step_running / 2)
    assert two.compute == pytest.approx(one.compute / 2)
    assert two.kv_held == pytest.approx(one.kv_held / 2)


@pytest.mark.parametrize(
    ("replicas", "headroom", "buy"),
    [(1, 0.0, 1), (2, 0.25, 3), (4, 0.25, 5), (10, 0.1, 11), (3, 0.1, 4), (7, 1.0, 14)],
)
def test_headroom_rounds_up_and_never_on_float_noise(
    replicas: int, headroom: float, buy: int
) -> None:
    assert with_headroom(replicas, headroom) == buy


@pytest.mark.parametrize(
    ("utilisation", "words"),
    [(0.5, "below"), (0.7, "within"), (0.8, "within"), (0.81, "above")],
)
def test_band_words(utilisation: float, words: str) -> None:
    assert f"{words} the 70%-80% band" in band_words(utilisation)


def test_the_verdict_buys_the_slo_fleet_plus_headroom() -> None:
    requests = [request(f"c{i}", 1, 100, 11, at=i * 0.05) for i in range(40)]
    fleet = Fleet(kv_blocks=1000, cost=COST)
    costs = Costs(gpus_per_replica=2, gpu_hour_usd=1.0, hosted_monthly_usd=None)
    plan = sweep(workload(*requests), fleet, [1, 2, 3, 4], 10.0, costs, headroom=0.5)
    assert plan.chosen is not None
    assert plan.chosen.replicas == 1  # a 10 s SLO: one meets it
    assert plan.buy == 2
    line = verdict(plan)
    assert "Buy 2 replica(s) (1 + 50% headroom, rounded up)" in line
    assert "4 GPU(s), $2,920.00/month" in line  # 2 replicas x 2 GPUs x $1 x 730 h
