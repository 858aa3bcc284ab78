"""Noise calibration: disagreement beyond what the primary shows against itself.

Two calls to the same model disagree now and then (sampling, batching, a reworded
sentence). So each comparator gets two rates: how often the candidate disagrees with the
primary, and how often a second primary call disagrees with the first (the noise floor).
The excess, candidate minus noise, is what the candidate adds; its parity is
1 - max(0, excess), so a candidate that disagrees no more than the primary disagrees with
itself scores as full parity. The interval on the excess is Newcombe's hybrid score
interval from two Wilson intervals (`stats`).

With fewer noise samples than `min_noise_samples` for a comparator the verdict is
Inconclusive and no parity figure is given: a floor guessed from three pairs would let any
candidate through, or none.

The overall parity is the lowest comparator parity: one aspect that broke (tool calls) must
not be averaged away by the many that did not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.intervals import newcombe_difference, z_for
from kvmigrate.parity.result import COMPARATOR_NAMES, PairScore

CONCLUSIVE = "conclusive"
INCONCLUSIVE = "inconclusive"
NOT_APPLICABLE = "not_applicable"
NO_DATA = "no_data"


@dataclass(frozen=True, slots=True)
class NoiseSettings:
    """min_noise_samples: primary-vs-primary pairs a comparator needs for a verdict.
    confidence: the level of the intervals (two-sided)."""

    min_noise_samples: int = 20
    confidence: float = 0.95


@dataclass(slots=True)
class Tally:
    """Counts of scorable pairs: per comparator, how often it applied and disagreed."""

    pairs: int = 0
    agreed: int = 0
    applicable: Counter[str] = field(default_factory=Counter)
    disagree: Counter[str] = field(default_factory=Counter)

    def add(self, applicable: Iterable[str], disagree: Iterable[str]) -> None:
        names, failing = set(applicable), set(disagree)
        self.pairs += 1
        self.agreed += not failing
        self.applicable.update(names)
        self.disagree.update(failing & names)

    def add_score(self, score: PairScore) -> None:
        if score.scorable:
            self.add(score.applicable, score.disagreements)


def tally(scores: Iterable[PairScore]) -> Tally:
    result = Tally()
    for score in scores:
        result.add_score(score)
    return result


@dataclass(frozen=True, slots=True)
class ComparatorParity:
    """One comparator's noise-adjusted figures; rates and parity are None when it is not
    conclusive (excess and parity) or has no samples (rates)."""

    name: str
    status: str
    candidate_n: int
    candidate_disagree: int
    noise_n: int
    noise_disagree: int
    excess: float | None = None
    excess_low: float | None = None
    excess_high: float | None = None

    @property
    def candidate_rate(self) -> float | None:
        return self.candidate_disagree / self.candidate_n if self.candidate_n else None

    @property
    def noise_rate(self) -> float | None:
        return self.noise_disagree / self.noise_n if self.noise_n else None

    @property
    def parity(self) -> float | None:
        return None if self.excess is None else 1.0 - max(0.0, self.excess)

    @property
    def parity_low(self) -> float | None:
        return None if self.excess_high is None else 1.0 - max(0.0, self.excess_high)

    @property
    def parity_high(self) -> float | None:
        return None if self.excess_low is None else 1.0 - max(0.0, self.excess_low)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "candidate": {
                "n": self.candidate_n,
                "disagree": self.candidate_disagree,
                "rate": _round(self.candidate_rate),
            },
            "noise": {
                "n": self.noise_n,
                "disagree": self.noise_disagree,
                "rate": _round(self.noise_rate),
            },
            "excess": _round(self.excess),
            "excess_interval": [_round(self.excess_low), _round(self.excess_high)],
            "parity": _round(self.parity),
            "parity_interval": [_round(self.parity_low), _round(self.parity_high)],
        }


@dataclass(frozen=True, slots=True)
class ParityReport:
    """The noise-adjusted verdict over many pairs. `parity` is None unless `status` is
    conclusive; `raw_agreement` is the plain share of candidate pairs that agreed on every
    comparator, shown for context and never used for a verdict."""

    status: str
    comparators: tuple[ComparatorParity, ...]
    candidate_pairs: int
    noise_pairs: int
    parity: float | None = None
    parity_low: float | None = None
    parity_high: float | None = None
    raw_agreement: float | None = None
    noise_agreement: float | None = None
    reason: str = ""
    confidence: float = 0.95

    def get(self, name: str) -> ComparatorParity | None:
        return next((c for c in self.comparators if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "parity": _round(self.parity),
            "parity_interval": [_round(self.parity_low), _round(self.parity_high)],
            "confidence": self.confidence,
            "interval_method": "Newcombe hybrid score (Wilson) for candidate minus noise",
            "candidate_pairs": self.candidate_pairs,
            "noise_pairs": self.noise_pairs,
            "raw_agreement": _round(self.raw_agreement),
            "noise_agreement": _round(self.noise_agreement),
            "comparators": [c.to_dict() for c in self.comparators],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def comparator_parity(
    name: str, candidate: Tally, noise: Tally, settings: NoiseSettings
) -> ComparatorParity:
    n1, k1 = candidate.applicable[name], candidate.disagree[name]
    n2, k2 = noise.applicable[name], noise.disagree[name]
    if n1 == 0:
        return ComparatorParity(name, NOT_APPLICABLE, n1, k1, n2, k2)
    if n2 < settings.min_noise_samples:
        return ComparatorParity(name, INCONCLUSIVE, n1, k1, n2, k2)
    excess, interval = newcombe_difference(k1, n1, k2, n2, z_for(settings.confidence))
    return ComparatorParity(name, CONCLUSIVE, n1, k1, n2, k2, excess, interval.low, interval.high)


def calibrate(
    candidate: Tally, noise: Tally, settings: NoiseSettings | None = None
) -> ParityReport:
    """The noise-adjusted report from candidate-vs-primary and primary-vs-primary tallies."""
    settings = settings or NoiseSettings()
    names = sorted(set(candidate.applicable) | set(noise.applicable), key=_order)
    comparators = tuple(comparator_parity(n, candidate, noise, settings) for n in names)
    base: dict[str, Any] = {
        "comparators": comparators,
        "candidate_pairs": candidate.pairs,
        "noise_pairs": noise.pairs,
        "raw_agreement": candidate.agreed / candidate.pairs if candidate.pairs else None,
        "noise_agreement": noise.agreed / noise.pairs if noise.pairs else None,
        "confidence": settings.confidence,
    }
    if candidate.pairs == 0:
        return ParityReport(NO_DATA, reason="no scored candidate pairs", **base)
    short = [c for c in comparators if c.status == INCONCLUSIVE]
    need = ", ".join(f"{c.name} ({c.noise_n})" for c in short)
    decided = [c for c in comparators if c.status == CONCLUSIVE]
    if not decided:
        reason = f"too few noise samples (need {settings.min_noise_samples}): {need}"
        return ParityReport(INCONCLUSIVE, reason=reason, **base)
    # A comparator that applies to few requests (JSON mode, say) must not hold the whole
    # verdict hostage: the figure covers the comparators with enough noise samples, and
    # the reason names the ones still waiting.
    worst = min(decided, key=lambda c: (c.parity or 0.0, c.name))
    reason = f"lowest comparator: {worst.name}"
    if short:
        reason += f"; not yet covered (too few noise samples): {need}"
    return ParityReport(
        CONCLUSIVE,
        parity=worst.parity,
        parity_low=min(c.parity_low or 0.0 for c in decided),
        parity_high=min(c.parity_high or 0.0 for c in decided),
        reason=reason,
        **base,
    )


def _order(name: str) -> tuple[int, str]:
    return (COMPARATOR_NAMES.index(name) if name in COMPARATOR_NAMES else 99, name)
