"""Parity columns for the records database: one scored pair, stored as plain values.

The recorder calls this on its writer thread when a shadow copy (or a second primary call,
for the noise floor) finishes and the answer it copies is still at hand. Storing the flags
(which comparators applied, which disagreed) rather than only a score lets gates and the
report rebuild the noise-adjusted figure for any window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from kvmigrate.parity.aggregate import CANDIDATE, NOISE, ParityAggregator
from kvmigrate.parity.answer import UNSET
from kvmigrate.parity.compare import score_exchange_pair
from kvmigrate.parity.noise import NoiseSettings

CANDIDATE_KIND = CANDIDATE
NOISE_KIND = NOISE


class Answered(Protocol):
    route: str
    status: int | None
    error: str | None
    request_body: bytes
    chunks: list[bytes]


@dataclass(frozen=True, slots=True)
class ParityFields:
    kind: str
    score: float | None
    applicable: str  # JSON array of comparator names
    disagree: str
    tool_agree: float | None
    json_valid: float | None


def parity_fields(
    kind: str,
    primary: Answered,
    other: Answered,
    other_assembled: Any = UNSET,
    primary_assembled: Any = UNSET,
) -> ParityFields:
    """Score `other` (the candidate's copy, or a second primary call) against `primary`.
    `other_assembled`, `primary_assembled`: their answers already reassembled, when the
    caller has them."""
    pair = score_exchange_pair(
        primary.route,
        primary.request_body,
        b"".join(primary.chunks),
        _status(primary),
        b"".join(other.chunks),
        _status(other),
        candidate_assembled=other_assembled,
        primary_assembled=primary_assembled,
    )
    tools, structured = pair.get("tool_calls"), pair.get("structured")
    return ParityFields(
        kind=kind,
        score=pair.score,
        applicable=orjson.dumps(sorted(pair.applicable) if pair.scorable else []).decode(),
        disagree=orjson.dumps(sorted(pair.disagreements) if pair.scorable else []).decode(),
        tool_agree=None if tools is None else float(tools.agree),
        json_valid=None if structured is None else float(structured.agree),
    )


def noise_adjusted(
    flags: Iterable[tuple[str | None, str | None, str | None]], min_noise_samples: int = 20
) -> tuple[float | None, int, int]:
    """(parity, candidate pairs, noise pairs) from stored (kind, applicable, disagree) flags.
    Parity is None while the noise floor is not yet known (too few noise pairs)."""
    aggregator, noise = flag_aggregator(flags, min_noise_samples)
    parity, samples = aggregator.window_figures()
    return parity, samples, noise


def flag_aggregator(
    flags: Iterable[tuple[str | None, str | None, str | None]], min_noise_samples: int = 20
) -> tuple[ParityAggregator, int]:
    """The stored flags in an aggregator (its report has every comparator's counts), and
    how many noise pairs they held."""
    aggregator = ParityAggregator(NoiseSettings(min_noise_samples=min_noise_samples))
    noise = 0
    for kind, applicable, disagree in flags:
        if kind not in (CANDIDATE_KIND, NOISE_KIND) or not applicable:
            continue
        names = orjson.loads(applicable)
        if not names:
            continue
        aggregator.add_flags(kind, names, orjson.loads(disagree or "[]"))
        noise += kind == NOISE_KIND
    return aggregator, noise


def _status(answer: Answered) -> int | None:
    return None if answer.error is not None and answer.status is None else answer.status
