"""Refine a cost model against a recorded run: scale it until the simulated replay of the
recording gives the TTFTs the recording measured.

A probe measures requests alone; real traffic adds what a probe cannot see, such as the
server's own CPU work per stream under concurrency. Replaying a recording of the engine
under its real load, through the simulator, and comparing TTFT p50 by turn, fits two
factors: one on the fixed costs (per step, per request, per decoding sequence) and one on
the per-token costs (prefill, cached, attention). A coarse geometric grid, then a finer
one around the best point: a few hundred simulations of the recording, each cheap.

The fit prefers factors near the probe's. A recording of similar turns can hardly tell a
larger fixed cost from a smaller per-token one: on benchmarks/plan_fidelity.py's workload
A against real vLLM, both x0.71 fixed with x1.19 per token and x3.36 with x0.59 fit A's
turns within 6-7% RMS, and the second then predicted workload B 34-45% too slow. So the
fit weighs its error on the turns (each turn's p50 taken as good to about 10%) against
how far the factors move from the probe's (taken as good to about a factor of 2): the
most likely factors given both, not the best fit to the recording alone.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import replace

from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.metrics import TURN_ROWS, figures
from kvmigrate.plan.simulate import Fleet, simulate
from kvmigrate.plan.workload import Workload


def recorded_ttft_by_turn(workload: Workload) -> dict[str, float]:
    """The recording's own TTFT p50 per turn row (as `metrics` labels them)."""
    by_turn: dict[str, list[float]] = defaultdict(list)
    for r in workload.requests:
        if r.recorded_ttft_s is not None:
            key = min(max(r.turn, 1), TURN_ROWS)
            by_turn[f"{key}+" if key == TURN_ROWS else str(key)].append(r.recorded_ttft_s)
    return {turn: statistics.median(values) for turn, values in by_turn.items()}


def scaled(cost: CostModel, fixed: float, tokens: float, label: str) -> CostModel:
    return replace(
        cost,
        overhead_s=cost.overhead_s * fixed,
        request_s=cost.request_s * fixed,
        decode_seq_s=cost.decode_seq_s * fixed,
        prefill_token_s=cost.prefill_token_s * tokens,
        cached_token_s=cost.cached_token_s * tokens,
        attention_s=cost.attention_s * tokens,
        source=label,
    )


TURN_SPREAD = 0.1  # a recorded turn's TTFT p50, as a log ratio: good to about 10%
PROBE_SPREAD = math.log(2.0)  # a probe's factors, as a log ratio: good to about a factor of 2


def _errors(cost: CostModel, workload: Workload, fleet: Fleet, replicas: int,
            target: dict[str, float]) -> list[float]:  # fmt: skip
    """The squared log ratio of simulated to recorded TTFT p50, turn by turn."""
    predicted = figures(simulate(workload, replace(fleet, cost=cost), replicas))
    return [
        math.log(max(t.ttft_p50_s, 1e-6) / target[t.turn]) ** 2
        for t in predicted.turns
        if target.get(t.turn)
    ]


def _misfit(errors: list[float], fixed: float, tokens: float) -> float:
    """Minus the log likelihood, up to a constant, of the factors given the recording's
    turns and the probe: lognormal errors on each."""
    if not errors:
        return math.inf
    moved = math.log(fixed) ** 2 + math.log(tokens) ** 2
    return sum(errors) / TURN_SPREAD**2 + moved / PROBE_SPREAD**2


def refine(
    workload: Workload, fleet: Fleet, replicas: int, label: str = "refined"
) -> tuple[CostModel, float]:
    """The fleet's cost model scaled to fit the recording; and its RMS log error."""
    target = recorded_ttft_by_turn(workload)
    if not target:
        raise ValueError("the recording holds no TTFT to refine against")
    best = (math.inf, math.inf, 1.0, 1.0)
    for step, span in ((2.0, 4), (2.0**0.25, 4)):
        _, _, f0, t0 = best
        for i in range(-span, span + 1):
            for j in range(-span, span + 1):
                f, t = f0 * step**i, t0 * step**j
                cost = scaled(fleet.cost, f, t, label)
                errors = _errors(cost, workload, fleet, replicas, target)
                mse = statistics.fmean(errors) if errors else math.inf
                best = min(best, (_misfit(errors, f, t), mse, f, t))
    _, mse, f, t = best
    return scaled(fleet.cost, f, t, label), math.sqrt(mse)
