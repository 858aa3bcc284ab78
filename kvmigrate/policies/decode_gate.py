"""The decode-speed gate: the candidate's median output tokens per second per stream.

Optional (`rollout.gates.tps_p50_min`, off by default). The median of the window's
per-stream speeds (`policies.decode_speed`) gets the same distribution-free interval as the
TTFT gate's p95, at the always-valid z: Passed when the whole interval reaches the minimum,
Failed when it lies below it, Inconclusive otherwise, with the conversations still needed."""

from __future__ import annotations

from typing import Any

from kvmigrate.intervals import Interval, quantile_interval
from kvmigrate.percentile import percentile
from kvmigrate.policies.gate_model import (
    GateConfig,
    GateResult,
    bounds,
    still_needed,
    too_few_requests,
)
from kvmigrate.policies.sequential import Verdict, always_valid_z, judge, more_needed, needed_scale
from kvmigrate.policies.window import BackendWindow

NAME = "decode_speed"


def decode_gate(candidate: BackendWindow, config: GateConfig) -> GateResult:
    """`config.tps_p50_min` must be set (the caller leaves the gate out otherwise)."""
    minimum = config.tps_p50_min
    assert minimum is not None
    sample = tuple(sorted(candidate.tps_sample))
    p50 = percentile(sample, 50)
    figures: dict[str, Any] = {
        "streams": len(sample),
        "tps_p50": None if p50 is None else round(p50, 2),
        "tps_p50_min": minimum,
    }
    if p50 is None:
        detail = (
            f"no candidate stream with decode timing and usage yet; have {candidate.requests} "
            "requests (streams count when their answer carries usage)"
        )
        return GateResult(NAME, Verdict.INCONCLUSIVE, detail, figures, threshold=minimum)
    if candidate.requests < config.min_requests:
        detail = too_few_requests(candidate, config, "decode speed")
        return GateResult(NAME, Verdict.INCONCLUSIVE, detail, figures, threshold=minimum)

    def verdict_at(scale: float) -> Verdict:
        iv = median_interval(sample, len(sample) * scale, config)
        return judge(iv.low, iv.high, minimum, higher_is_better=True)

    interval = median_interval(sample, len(sample), config)
    verdict = verdict_at(1.0)
    more = None
    detail = (
        f"candidate {p50:.1f} tok/s per stream, p50 [{_end(interval.low)}, "
        f"{_end(interval.high)}] vs {minimum:g} (rollout.gates.tps_p50_min)"
    )
    if verdict is Verdict.INCONCLUSIVE:
        more = more_needed(candidate.conversations, needed_scale(verdict_at))
        detail += still_needed(candidate, more)
    return GateResult(
        NAME,
        verdict,
        detail,
        figures,
        estimate=round(p50, 4),
        threshold=minimum,
        needed_conversations=more,
        **bounds(interval),
    )


def median_interval(ordered: tuple[float, ...], n: float, config: GateConfig) -> Interval:
    z = always_valid_z(n, config.confidence, config.min_requests)
    return quantile_interval(ordered, 0.5, z, n)


def _end(value: float) -> str:
    return f"{value:.1f}" if abs(value) != float("inf") else "unbounded"
