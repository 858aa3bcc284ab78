"""The scorecard's inputs from the report's own figures: GPU use and cost per token
(report.gpu, report.cost_per_token, filled when the config scrapes) and whether users stay
(report.users, the satisfaction score's effect between the arms)."""

from __future__ import annotations

from kvmigrate.report.cost_per_token import CostFigures
from kvmigrate.report.gpu import GpuFigures
from kvmigrate.report.model import Report
from kvmigrate.report.scorecard_inputs import CostInput, GpuInput, ScorecardInputs, UsersInput

UTILISATION_SERIES = "GPU utilisation"


def report_inputs(report: Report) -> ScorecardInputs:
    users = report.users
    return ScorecardInputs(
        gpu=gpu_input(report.gpu),
        cost=cost_input(report.cost_per_token),
        users=None if users is None else UsersInput(**users.scorecard_fields("score")),
    )


def gpu_input(gpu: GpuFigures | None) -> GpuInput | None:
    """Mean utilisation as a share in [0, 1]; the samples are the GPU source's scrapes."""
    if gpu is None:
        return None
    mean = gpu.utilisation_pct
    samples = sum(len(s.points) for s in gpu.series if s.name == UTILISATION_SERIES)
    return GpuInput(
        utilisation=None if mean.value is None else mean.value / 100.0,
        samples=samples,
        source=gpu.source,
        missing=mean.reason,
    )


def cost_input(cost: CostFigures | None) -> CostInput | None:
    """The hosted price of the primary's tokens against the candidate's GPU-hours over the
    tokens it served, per million tokens."""
    if cost is None:
        return None
    arms = {a.arm: a for a in cost.arms}
    primary, candidate = arms.get("primary"), arms.get("candidate")
    break_even = cost.break_even_utilisation_pct
    return CostInput(
        hosted_usd_per_m=primary.hosted_usd_per_m if primary else None,
        candidate_usd_per_m=candidate.self_hosted_usd_per_m if candidate else None,
        candidate_tokens=(candidate.input_tokens + candidate.output_tokens) if candidate else 0,
        break_even_utilisation=None if break_even is None else break_even / 100.0,
        source=f"${cost.gpu_hour_price:g}/GPU-hour"
        + (f", {cost.gpus_source}" if cost.gpus_source else ""),
        missing=cost.reason,
    )
