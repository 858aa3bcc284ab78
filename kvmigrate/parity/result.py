"""What a comparison says: one result per comparator, and the pair's score built from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Why a pair has no content comparison: the outcome of the two calls.
COMPARED = "compared"  # both answered 2xx: every applicable comparator ran
CANDIDATE_ERROR = "candidate_error"  # the primary answered, the candidate failed
BOTH_ERROR = "both_error"  # both failed: only the status class and error envelope compare
PRIMARY_ERROR = "primary_error"  # the primary failed: nothing to hold the candidate to
# Every comparator's name, in report order ("semantic" only with the extra).
COMPARATOR_NAMES = (
    "text",
    "topic",
    "semantic",
    "tool_calls",
    "structured",
    "finish_reason",
    "refusal",
    "length",
    "api_shape",
)


@dataclass(frozen=True, slots=True)
class ComparatorResult:
    """One comparator's verdict on one pair.

    agree: whether the candidate matches the primary on this aspect (a candidate that is
        better, e.g. valid JSON where the primary's was broken, agrees: parity looks for
        regressions). score: how close, in [0, 1]. detail: one line for a person.
    data: machine-readable figures (per-argument agreement, similarities, ...)."""

    name: str
    agree: bool
    score: float
    detail: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "agree": self.agree,
            "score": round(self.score, 4),
            "detail": self.detail,
            "data": dict(self.data),
        }


@dataclass(frozen=True, slots=True)
class PairScore:
    """The verdict on one (primary, candidate) pair.

    `results` holds only the comparators that apply to this pair (no tool comparison for a
    text answer, ...). A pair whose primary failed is not scorable: `score` is None and it
    must not count towards parity, because the candidate has nothing to be held to."""

    results: tuple[ComparatorResult, ...]
    outcome: str = COMPARED

    @property
    def scorable(self) -> bool:
        return self.outcome != PRIMARY_ERROR and bool(self.results)

    @property
    def agree(self) -> bool:
        return all(r.agree for r in self.results)

    @property
    def score(self) -> float | None:
        """The mean comparator score, capped at the lowest score of any comparator that
        disagrees: one broken aspect (a wrong tool) must not be averaged away by the
        aspects that happen to match."""
        if not self.scorable:
            return None
        mean = sum(r.score for r in self.results) / len(self.results)
        failing = [r.score for r in self.results if not r.agree]
        return min([mean, *failing])

    @property
    def applicable(self) -> frozenset[str]:
        return frozenset(r.name for r in self.results)

    @property
    def disagreements(self) -> frozenset[str]:
        return frozenset(r.name for r in self.results if not r.agree)

    def get(self, name: str) -> ComparatorResult | None:
        return next((r for r in self.results if r.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        score = self.score
        return {
            "outcome": self.outcome,
            "agree": self.agree,
            "score": None if score is None else round(score, 4),
            "comparators": [r.to_dict() for r in self.results],
        }
