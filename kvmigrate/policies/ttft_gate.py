"""The TTFT gate: an interval on the candidate's p95 and on its ratio to the primary's.

Each p95 gets a distribution-free interval from the order statistics of the window's raw
values (`kvmigrate.intervals.quantile_interval`, at the always-valid z), and the ratio an
interval built from the two (Newcombe's construction on the logarithms). Deterministic, unlike a
bootstrap, and as cheap as a sort. Passed when the candidate's p95 is surely under the
floor or the SLO, or the ratio surely within `ttft_p95_factor`; Failed when the ratio is
surely beyond it and the candidate's p95 surely above the floor (and the SLO, when set).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvmigrate.intervals import Interval, log_ratio_interval, quantile_interval
from kvmigrate.percentile import percentile
from kvmigrate.policies.gate_model import (
    GateConfig,
    GateResult,
    bounds,
    still_needed,
    too_few_requests,
)
from kvmigrate.policies.sequential import (
    Verdict,
    always_valid_z,
    judge,
    more_needed,
    needed_scale,
)
from kvmigrate.policies.window import BackendWindow

Q = 0.95


@dataclass(frozen=True, slots=True)
class _Evidence:
    measure: str
    candidate: tuple[float, ...]  # sorted, seconds
    primary: tuple[float, ...]
    candidate_n: int
    primary_n: int


def ttft_gate(primary: BackendWindow, candidate: BackendWindow, config: GateConfig) -> GateResult:
    ev = _evidence(primary, candidate)
    cand_p95, prim_p95 = percentile(ev.candidate, 95), percentile(ev.primary, 95)
    figures: dict[str, Any] = {
        "measure": ev.measure,
        "candidate_p95_ms": _ms(cand_p95),
        "primary_p95_ms": _ms(prim_p95),
        "slo_ms": config.ttft_p95_slo_ms,
        "factor": config.ttft_p95_factor,
        "floor_ms": config.ttft_p95_floor_ms,
    }
    waiting = _not_yet(ev, cand_p95, prim_p95, candidate, config, figures)
    if waiting is not None:
        return waiting
    assert cand_p95 is not None  # _not_yet answered for a window without one

    def verdict_at(scale: float) -> Verdict:
        return _verdict(ev, config, scale)[0]

    verdict, c, ratio = _verdict(ev, config, 1.0)
    more = None
    if verdict is Verdict.INCONCLUSIVE:
        more = more_needed(candidate.conversations, needed_scale(verdict_at))
    if ratio is None or prim_p95 is None:
        return _absolute(ev, cand_p95, c, config, figures, more, candidate)
    estimate = cand_p95 / prim_p95 if prim_p95 > 0 else math.inf
    detail = (
        f"candidate {ev.measure} {cand_p95 * 1000:.0f} ms [{_span_ms(c)}] = {estimate:.2f} "
        f"[{_span(ratio)}] x primary's {prim_p95 * 1000:.0f} ms vs "
        f"{config.ttft_p95_factor:g} x (rollout.gates.ttft_p95_factor)" + _floor_note(c, config)
    )
    if verdict is Verdict.INCONCLUSIVE:
        detail += still_needed(candidate, more)
    figures["ratio"] = round(estimate, 4) if math.isfinite(estimate) else None
    return GateResult(
        "ttft_p95",
        verdict,
        detail,
        figures,
        estimate=figures["ratio"],
        threshold=config.ttft_p95_factor,
        needed_conversations=more,
        **bounds(ratio),
    )


def _not_yet(
    ev: _Evidence,
    cand_p95: float | None,
    prim_p95: float | None,
    candidate: BackendWindow,
    config: GateConfig,
    figures: dict[str, Any],
) -> GateResult | None:
    """The answer when there is nothing to hold to a threshold yet; None when there is."""
    if cand_p95 is None:
        return _waiting(
            f"no candidate TTFT or latency recorded yet; have {candidate.requests} requests",
            figures,
        )
    if candidate.requests < config.min_requests:
        return _waiting(too_few_requests(candidate, config, f"its {ev.measure}"), figures)
    if prim_p95 is not None or config.ttft_p95_slo_ms is not None:
        return None
    c = _p95_interval(ev.candidate, ev.candidate_n, config)
    if c.high * 1000 <= config.ttft_p95_floor_ms:
        return _absolute(ev, cand_p95, c, config, figures)
    return _waiting(
        f"no primary {ev.measure} to compare with (rollout.gates.ttft_p95_factor); set "
        "rollout.gates.ttft_p95_slo_ms for an absolute target",
        figures,
    )


def _waiting(detail: str, figures: dict[str, Any]) -> GateResult:
    return GateResult("ttft_p95", Verdict.INCONCLUSIVE, detail, figures)


def _evidence(primary: BackendWindow, candidate: BackendWindow) -> _Evidence:
    # Streamed answers give TTFT; when the window has none (clients that do not stream),
    # total latency is the figure a user waits for, and is compared the same way.
    streamed = bool(candidate.ttft_sample or not candidate.latency_sample)
    measure = "TTFT p95" if streamed else "latency p95 (nothing streamed)"
    c = candidate.ttft_sample if streamed else candidate.latency_sample
    p = primary.ttft_sample if streamed else primary.latency_sample
    return _Evidence(measure, tuple(sorted(c)), tuple(sorted(p)), len(c), len(p))


def _p95_interval(ordered: Sequence[float], n: float, config: GateConfig) -> Interval:
    z = always_valid_z(n, config.confidence, config.min_requests)
    return quantile_interval(ordered, Q, z, n)


def _verdict(
    ev: _Evidence, config: GateConfig, scale: float
) -> tuple[Verdict, Interval, Interval | None]:
    """The verdict with both samples `scale` times as large, the candidate's p95 interval,
    and the ratio's (None without a primary figure)."""
    c = _p95_interval(ev.candidate, ev.candidate_n * scale, config)
    floor = config.ttft_p95_floor_ms / 1000
    slo = None if config.ttft_p95_slo_ms is None else config.ttft_p95_slo_ms / 1000
    ratio = None
    if ev.primary:
        p = _p95_interval(ev.primary, ev.primary_n * scale, config)
        ratio = log_ratio_interval(_q(ev.candidate), c, _q(ev.primary), p)
    if c.high <= floor or (slo is not None and c.high <= slo):
        return Verdict.PASSED, c, ratio
    # Only a p95 surely above the floor (and the SLO) can fail: under them it would pass.
    above = c.low > floor and (slo is None or c.low > slo)
    if ratio is None:
        assert slo is not None
        return (Verdict.FAILED if above else Verdict.INCONCLUSIVE), c, ratio
    verdict = judge(ratio.low, ratio.high, config.ttft_p95_factor, higher_is_better=False)
    if verdict is Verdict.FAILED and not above:
        verdict = Verdict.INCONCLUSIVE
    return verdict, c, ratio


def _absolute(
    ev: _Evidence,
    p95: float,
    c: Interval,
    config: GateConfig,
    figures: dict[str, Any],
    more: int | None = None,
    candidate: BackendWindow | None = None,
) -> GateResult:
    """The verdict against the floor or the SLO alone (no primary figure to divide by)."""
    verdict, _, _ = _verdict(ev, config, 1.0)
    limit = config.ttft_p95_slo_ms
    target = f"the {limit:g} ms SLO" if limit is not None else "no primary figure"
    detail = f"candidate {ev.measure} {p95 * 1000:.0f} ms [{_span_ms(c)}] vs {target}"
    detail += _floor_note(c, config)
    if verdict is Verdict.INCONCLUSIVE and candidate is not None:
        detail += still_needed(candidate, more)
    return GateResult(
        "ttft_p95",
        verdict,
        detail,
        figures,
        estimate=_ms(p95),
        threshold=limit,
        needed_conversations=more,
        **bounds(Interval(c.low * 1000, c.high * 1000)),
    )


def _floor_note(c: Interval, config: GateConfig) -> str:
    if c.high * 1000 <= config.ttft_p95_floor_ms:
        return f"; surely under the {config.ttft_p95_floor_ms:g} ms floor"
    return ""


def _q(ordered: Sequence[float]) -> float:
    value = percentile(ordered, 95)
    assert value is not None
    return value


def _span_ms(interval: Interval) -> str:
    return f"{_ms_text(interval.low)}, {_ms_text(interval.high)}"


def _ms_text(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if math.isfinite(seconds) else "unbounded"


def _span(interval: Interval) -> str:
    high = f"{interval.high:.2f}" if math.isfinite(interval.high) else "unbounded"
    return f"{interval.low:.2f}, {high}"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
