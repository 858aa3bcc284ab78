"""What a gate is configured with and what it answers, and the words of a gate that waits."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.intervals import Interval
from kvmigrate.policies.sequential import Verdict
from kvmigrate.policies.window import BackendWindow


@dataclass(frozen=True, slots=True)
class GateConfig:
    """min_conversations / min_requests: the candidate traffic a verdict needs.
    error_rate_margin: the candidate's error rate may exceed the primary's by this much.
    ttft_p95_slo_ms: an absolute TTFT p95 target for the candidate (None: not used).
    ttft_p95_factor: ... or at most this multiple of the primary's TTFT p95.
    ttft_p95_floor_ms: a candidate p95 under this always passes: 3 x a 2 ms TTFT is noise,
        not a regression.
    min_parity / min_parity_samples: noise-adjusted parity needed (None: gate off), and the
        scored pairs a comparator needs before its interval counts.
    tps_p50_min: the candidate's median output tokens per second per stream, after the
        first token, must surely reach this (None: gate off).
    window_seconds: how far back the evidence reaches (never before the last change).
    confidence: the level of the gates' always-valid intervals (`policies.sequential`).
    """

    min_conversations: int = 20
    min_requests: int = 100
    error_rate_margin: float = 0.01
    ttft_p95_slo_ms: float | None = None
    ttft_p95_factor: float = 1.5
    ttft_p95_floor_ms: float = 100.0
    min_parity: float | None = None
    min_parity_samples: int = 30
    tps_p50_min: float | None = None
    window_seconds: float = 3600.0
    confidence: float = 0.95


@dataclass(frozen=True, slots=True)
class GateResult:
    """A verdict with the evidence behind it: the estimate, its always-valid interval
    (`low`/`high`; None where unbounded or not yet known), the threshold it is held to,
    and the conversations still needed at the observed rates (None when they would not
    decide it, or it is decided)."""

    name: str
    verdict: Verdict
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    threshold: float | None = None
    needed_conversations: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict.value,
            "detail": self.detail,
            "estimate": self.estimate,
            "interval": [self.low, self.high],
            "threshold": self.threshold,
            "needed_conversations": self.needed_conversations,
            "figures": self.figures,
        }


def bounds(interval: Interval) -> dict[str, float | None]:
    """An interval as GateResult's `low` / `high`, infinite ends as None (JSON has no inf).
    Unrounded: a verdict can be checked against the very figures it reports."""
    return {
        "low": interval.low if math.isfinite(interval.low) else None,
        "high": interval.high if math.isfinite(interval.high) else None,
    }


def too_few_requests(candidate: BackendWindow, config: GateConfig, what: str) -> str:
    return (
        f"need {config.min_requests} candidate requests (rollout.gates.min_requests) before "
        f"{what} counts; have {candidate.requests}"
        + eta(candidate.requests, config.min_requests, candidate.span_s)
    )


def still_needed(candidate: BackendWindow, more: int | None) -> str:
    """The wait of an interval that straddles its threshold, in conversations."""
    if more is None:
        # Not "never": a quantile's interval is read off today's sample, so its resolution
        # stops the search (needed_scale) where fresh traffic would still narrow it.
        return "; the estimate is too close to the threshold to say how much more traffic it needs"
    have = candidate.conversations
    noun = "conversation" if more == 1 else "conversations"
    return f"; about {more} more {noun} at the observed rates" + eta(
        have, have + more, candidate.span_s
    )


def eta(have: float, need: float, span_s: float) -> str:
    """How long the missing evidence takes at the rate it arrived so far, if it arrived."""
    if have >= need:
        return ""
    if span_s < 1.0:
        return ""
    if have <= 0:
        return f"; none in the last {duration(span_s)}"
    left = (need - have) * span_s / have
    return f"; at the current rate ({duration(span_s)} so far) about {duration(left)} more"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
