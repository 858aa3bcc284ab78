"""Refining a cost model against a recording's own TTFTs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.metrics import figures
from kvmigrate.plan.refine import recorded_ttft_by_turn, refine, scaled
from kvmigrate.plan.simulate import Fleet, simulate
from kvmigrate.plan.synthetic import agent_workload
from kvmigrate.plan.workload import Workload

TRUTH = CostModel(
    overhead_s=0.004, prefill_token_s=1e-4, cached_token_s=1e-5, decode_seq_s=1e-3,
    request_s=0.01, attention_s=1e-8, source="truth",
)  # fmt: skip


def recording(workload: Workload, fleet: Fleet) -> Workload:
    """The workload as if recorded on an engine the truth describes."""
    ttft = {
        (j.request.conversation, j.request.turn): j.first_token_at - j.arrival
        for j in simulate(workload, fleet, 1).jobs
    }
    requests = tuple(
        replace(r, recorded_ttft_s=ttft[(r.conversation, r.turn)]) for r in workload.requests
    )
    return replace(workload, requests=requests)


def test_refine_finds_the_factors_a_probe_got_wrong() -> None:
    workload = agent_workload(40, 5, 1.0, system_tokens=600, turn_tokens=100, output_tokens=20)
    recorded = recording(workload, Fleet(4096, TRUTH))
    wrong = scaled(TRUTH, 2.0, 0.5, "probe")
    refined, rms = refine(recorded, Fleet(4096, wrong), 1)
    assert rms == pytest.approx(0.0, abs=1e-9)
    assert refined.request_s == pytest.approx(TRUTH.request_s)
    assert refined.prefill_token_s == pytest.approx(TRUTH.prefill_token_s)
    predicted = figures(simulate(recorded, Fleet(4096, refined), 1))
    target = recorded_ttft_by_turn(recorded)
    for row in predicted.turns:
        assert row.ttft_p50_s == pytest.approx(target[row.turn])


def test_refine_needs_recorded_ttfts() -> None:
    with pytest.raises(ValueError, match="no TTFT"):
        refine(agent_workload(2, 2, 1.0), Fleet(4096, TRUTH), 1)
