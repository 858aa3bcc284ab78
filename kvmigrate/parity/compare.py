"""`compare(request, primary, candidate)`: every comparator over one pair, as a PairScore.

`score_exchange_pair` is the same over recorded bytes (JSON or SSE) and HTTP statuses: the
seam the proxy calls on a background thread for each finished shadow pair. It is pure and
does no I/O; a pair costs well under a millisecond without the semantic comparator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from kvmigrate.parity.answer import (
    UNSET,
    Answer,
    Outcome,
    extract_answer,
    outcome_of,
    read_outcome,
)
from kvmigrate.parity.context import Comparator, PairContext
from kvmigrate.parity.finish import compare_finish
from kvmigrate.parity.length import compare_length
from kvmigrate.parity.refusal import compare_refusal
from kvmigrate.parity.result import (
    BOTH_ERROR,
    CANDIDATE_ERROR,
    COMPARATOR_NAMES,
    COMPARED,
    PRIMARY_ERROR,
    ComparatorResult,
    PairScore,
)
from kvmigrate.parity.semantic import SemanticScorer, compare_semantic
from kvmigrate.parity.settings import ParitySettings
from kvmigrate.parity.shape import compare_errors, compare_shape
from kvmigrate.parity.structured import compare_structured
from kvmigrate.parity.text import compare_text, compare_topic
from kvmigrate.parity.tools import compare_tools

DEFAULT_SETTINGS = ParitySettings()
COMPARATORS: tuple[Comparator, ...] = (
    compare_text,
    compare_topic,
    compare_tools,
    compare_structured,
    compare_finish,
    compare_refusal,
    compare_length,
    compare_shape,
)
_EMPTY = Answer("", None, (), None, 0)


def compare(
    request: Mapping[str, Any],
    primary: Outcome | Mapping[str, Any],
    candidate: Outcome | Mapping[str, Any],
    *,
    settings: ParitySettings = DEFAULT_SETTINGS,
    semantic: SemanticScorer | None = None,
) -> PairScore:
    """Compare two answers to `request`. A plain dict is taken as a 200 answer (already
    reassembled if it was streamed); an `Outcome` carries the status and error too."""
    p, c = outcome_of(primary), outcome_of(candidate)
    if not p.ok:
        if c.ok:
            return PairScore((), PRIMARY_ERROR)
        return PairScore((compare_errors(p, c),), BOTH_ERROR)
    if not c.ok:
        return PairScore((compare_errors(p, c),), CANDIDATE_ERROR)
    ctx = PairContext(
        request,
        p,
        c,
        extract_answer(p.response or {}),
        extract_answer(c.response or {}) if c.response else _EMPTY,
        settings,
    )
    results: list[ComparatorResult] = []
    for comparator in COMPARATORS:
        result = comparator(ctx)
        if result is not None:
            results.append(result)
    if semantic is not None:
        result = compare_semantic(ctx, semantic)
        if result is not None:
            results.append(result)
    order = {name: i for i, name in enumerate(COMPARATOR_NAMES)}
    results.sort(key=lambda r: order.get(r.name, len(order)))
    return PairScore(tuple(results), COMPARED)


def score_exchange_pair(
    route: str,
    request_body: bytes,
    primary_body: bytes,
    primary_status: int | None,
    candidate_body: bytes,
    candidate_status: int | None,
    *,
    settings: ParitySettings = DEFAULT_SETTINGS,
    semantic: SemanticScorer | None = None,
    candidate_assembled: Any = UNSET,
    primary_assembled: Any = UNSET,
) -> PairScore:
    """Score a recorded pair: bodies as they came off the wire, JSON or SSE. A status of
    None means the call got no HTTP answer (a transport error). `candidate_assembled`,
    `primary_assembled`: the streamed answers, already reassembled by the caller."""
    try:
        request = orjson.loads(request_body) if request_body else {}
    except orjson.JSONDecodeError:
        request = {}
    return compare(
        request if isinstance(request, dict) else {},
        read_outcome(route, primary_body, primary_status, primary_assembled),
        read_outcome(route, candidate_body, candidate_status, candidate_assembled),
        settings=settings,
        semantic=semantic,
    )
