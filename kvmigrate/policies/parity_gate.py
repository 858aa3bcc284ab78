"""The parity gate: an interval per comparator, and only comparators with enough pairs count.

Each comparator's parity is 1 - its excess disagreement over the noise floor (the primary
against itself), with Newcombe's interval on that excess at the always-valid z. A
comparator counts ("covered") once it applied to `min_parity_samples` scored pairs and to
the noise pairs a floor needs; before that it is listed as not yet covered and cannot set
the headline, so a comparator seen 13 times no longer decides a rollout alone. Passed when
every covered comparator's interval clears `min_parity`, Failed when one lies below it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmigrate.intervals import Interval, newcombe_difference
from kvmigrate.policies.gate_model import GateConfig, GateResult, bounds, eta, still_needed
from kvmigrate.policies.sequential import (
    Verdict,
    always_valid_z,
    judge,
    more_needed,
    needed_scale,
)
from kvmigrate.policies.window import BackendWindow, ComparatorCounts


@dataclass(frozen=True, slots=True)
class ComparatorVerdict:
    name: str
    parity: float
    interval: Interval
    verdict: Verdict


def parity_gate(candidate: BackendWindow, config: GateConfig) -> GateResult:
    assert config.min_parity is not None
    covered, waiting = _split(candidate, config)
    figures: dict[str, Any] = {
        "parity": candidate.parity,
        "samples": candidate.parity_samples,
        "min_parity": config.min_parity,
        "min_parity_samples": config.min_parity_samples,
        "noise_pairs": candidate.noise_pairs,
        "noise_needed": candidate.noise_needed,
        "not_yet_covered": [c.name for c in waiting],
    }
    if candidate.parity_samples < config.min_parity_samples or not covered:
        return GateResult(
            "parity",
            Verdict.INCONCLUSIVE,
            _parity_wait(candidate, config, waiting),
            figures,
            threshold=config.min_parity,
        )

    def judged_at(scale: float) -> list[ComparatorVerdict]:
        return [_judge(c, config, scale) for c in covered]

    judged = judged_at(1.0)
    verdict = _overall(judged)
    figures["comparators"] = [_figures(j) for j in judged]
    worst = min(judged, key=lambda j: (j.parity, j.name))
    headline = Interval(min(j.interval.low for j in judged), min(j.interval.high for j in judged))
    detail = _headline_detail(judged, worst, config)
    if waiting:
        detail += "; not yet covered: " + ", ".join(_short(c, candidate, config) for c in waiting)
    more = None
    if verdict is Verdict.INCONCLUSIVE:
        scale = needed_scale(lambda s: _overall(judged_at(s)))
        more = more_needed(candidate.conversations, scale)
        detail += still_needed(candidate, more)
    return GateResult(
        "parity",
        verdict,
        detail,
        figures,
        estimate=round(worst.parity, 4),
        threshold=config.min_parity,
        needed_conversations=more,
        **bounds(headline),
    )


def _headline_detail(
    judged: list[ComparatorVerdict], worst: ComparatorVerdict, config: GateConfig
) -> str:
    """The lowest comparator with its own interval, and the one whose bound is lowest where
    that is another: a line naming one comparator beside another's interval read as a
    contradiction. It says what the figure covers, since the report's noise-adjusted
    parity covers its whole window and every comparator with a noise floor."""
    noun = "comparator" if len(judged) == 1 else "comparators"
    text = (
        f"noise-adjusted parity since the last change, lowest of {len(judged)} {noun} with "
        f"{config.min_parity_samples}+ pairs: {worst.name} {worst.parity:.3f} "
        f"[{worst.interval.low:.3f}, {worst.interval.high:.3f}]"
    )
    bound = min(judged, key=lambda j: (j.interval.low, j.name))
    if bound.interval.low < worst.interval.low:
        text += (
            f"; lowest bound {bound.name} {bound.parity:.3f} "
            f"[{bound.interval.low:.3f}, {bound.interval.high:.3f}]"
        )
    return text + f" vs {config.min_parity:g} (rollout.gates.min_parity)"


def _split(
    candidate: BackendWindow, config: GateConfig
) -> tuple[list[ComparatorCounts], list[ComparatorCounts]]:
    noise_floor = _noise_floor(candidate)
    covered: list[ComparatorCounts] = []
    waiting: list[ComparatorCounts] = []
    for c in candidate.comparators:
        if c.candidate_n == 0:
            continue
        enough = c.candidate_n >= config.min_parity_samples and c.noise_n >= noise_floor
        (covered if enough else waiting).append(c)
    return covered, waiting


def _judge(c: ComparatorCounts, config: GateConfig, scale: float) -> ComparatorVerdict:
    n1, n2 = round(c.candidate_n * scale), round(c.noise_n * scale)
    k1 = round(c.candidate_disagree / c.candidate_n * n1)
    k2 = round(c.noise_disagree / c.noise_n * n2)

    def z(n: int) -> float:
        return always_valid_z(n, config.confidence, config.min_parity_samples)

    excess, iv = newcombe_difference(k1, n1, k2, n2, z(n1), z(n2))
    parity = Interval(1.0 - max(0.0, iv.high), 1.0 - max(0.0, iv.low))
    assert config.min_parity is not None
    verdict = judge(parity.low, parity.high, config.min_parity, higher_is_better=True)
    return ComparatorVerdict(c.name, 1.0 - max(0.0, excess), parity, verdict)


def _figures(j: ComparatorVerdict) -> dict[str, Any]:
    return {
        "name": j.name,
        "verdict": j.verdict.value,
        "parity": round(j.parity, 4),
        **bounds(j.interval),
    }


def _overall(judged: list[ComparatorVerdict]) -> Verdict:
    verdicts = {j.verdict for j in judged}
    if Verdict.FAILED in verdicts:
        return Verdict.FAILED
    if verdicts == {Verdict.PASSED}:
        return Verdict.PASSED
    return Verdict.INCONCLUSIVE


def _noise_floor(candidate: BackendWindow) -> int:
    """The noise pairs each comparator needs of its own: at least one."""
    return max(1, candidate.noise_needed)


def _short(c: ComparatorCounts, candidate: BackendWindow, config: GateConfig) -> str:
    floor = _noise_floor(candidate)
    return (
        f"{c.name} ({c.candidate_n}/{config.min_parity_samples} pairs, {c.noise_n}/{floor} noise)"
    )


def _parity_wait(
    candidate: BackendWindow, config: GateConfig, waiting: list[ComparatorCounts]
) -> str:
    """What parity still lacks: scored pairs, or the noise floor they are measured against."""
    have, need, span = candidate.parity_samples, config.min_parity_samples, candidate.span_s
    noise, floor = candidate.noise_pairs, candidate.noise_needed
    if have < need:
        also = f"; and {noise} of the {floor} noise pairs" if noise < floor else ""
        return (
            f"need {need} scored pairs (rollout.gates.min_parity_samples); have {have}"
            + eta(have, need, span)
            + also
        )
    if noise < floor:
        return (
            f"{have} scored pairs are in, but the noise floor needs {floor} primary-vs-primary "
            f"pairs; have {noise}" + eta(noise, floor, span) + ". Raise rollout.noise_sample "
            "(share of conversations sent to the primary twice) or rollout.noise_per_minute"
        )
    return (
        f"{have} scored pairs are in, but no comparator has both {need} scored pairs "
        "(rollout.gates.min_parity_samples) and its noise pairs yet; not yet covered: "
        + ", ".join(_short(c, candidate, config) for c in waiting)
    )
