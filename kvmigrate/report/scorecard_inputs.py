"""Figures the scorecard takes from outside the records: GPU use (a scrape of the
candidate's metrics), cost per token (prices against GPU-hours), and whether users stay
(feedback scores, abandonment). Each is optional: absent, its row says "not measured" and
why. `missing` says why a figure that was looked for is None."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuInput:
    """The candidate's mean GPU utilisation over the report's window, as a share in [0, 1],
    with its interval when the source gives one; `samples`: the scrapes behind it;
    `source`: where it was read (a DCGM exporter's URL, a Prometheus query)."""

    utilisation: float | None = None
    low: float | None = None
    high: float | None = None
    samples: int = 0
    source: str = ""
    missing: str = ""


@dataclass(frozen=True, slots=True)
class CostInput:
    """Cost per 1M tokens: the primary's from the hosted price table, the candidate's from
    GPU-hours over the tokens it served in the window (with its interval when known);
    `candidate_tokens`: those tokens; `break_even_utilisation`: the GPU utilisation at
    which both cost the same."""

    hosted_usd_per_m: float | None = None
    candidate_usd_per_m: float | None = None
    low: float | None = None
    high: float | None = None
    candidate_tokens: int = 0
    break_even_utilisation: float | None = None
    source: str = ""
    missing: str = ""


@dataclass(frozen=True, slots=True)
class UsersInput:
    """Whether users stay or are happier on the candidate: one measure per arm (a mean
    satisfaction score, turns per conversation, ...), the difference candidate - primary
    with its 95% interval, and the conversations behind each arm's figure.
    `higher_is_better` False for a measure like abandonment."""

    measure: str = "satisfaction score"
    primary: float | None = None
    candidate: float | None = None
    difference: float | None = None
    low: float | None = None
    high: float | None = None
    primary_n: int = 0
    candidate_n: int = 0
    higher_is_better: bool = True
    source: str = ""
    missing: str = ""


@dataclass(frozen=True, slots=True)
class ScorecardInputs:
    gpu: GpuInput | None = None
    cost: CostInput | None = None
    users: UsersInput | None = None
