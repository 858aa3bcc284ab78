"""The parity section: "not yet scored" until shadow copies have been scored.

A shadow copy's record carries its pair score against the primary answer it shadowed
(`parity_kind` = candidate), and a noise call's record its score against the same answer
(`parity_kind` = noise). The headline is the noise-adjusted figure: the candidate's
disagreement beyond the primary's disagreement with itself; without enough noise pairs it
says so (inconclusive) instead of inventing a figure."""

from __future__ import annotations

import math
from collections.abc import Sequence

import orjson

from kvmigrate.parity.answer import extract_answer
from kvmigrate.parity.noise import CONCLUSIVE
from kvmigrate.parity.recording import NOISE_KIND, flag_aggregator
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report.model import Divergence, ParitySummary
from kvmigrate.report.rows import Row

BINS = 10
WORST = 5
EXCERPT_CHARS = 160


def parity_summary(rows: Sequence[Row], store: RecordStore | None = None) -> ParitySummary:
    # A score the scorer could not have written (inf in a hand-edited or PostgreSQL
    # database; NaN in PostgreSQL) is no score: it would crash the histogram.
    scored = [r for r in rows if _finite(r.parity_score) and r.parity_kind != NOISE_KIND]
    if not scored:
        return ParitySummary()
    flags = [
        (r.parity_kind, r.parity_applicable, r.parity_disagree)
        for r in rows
        if r.parity_kind is not None
    ]
    aggregator, noise_pairs = flag_aggregator(flags)
    figures = aggregator.report()
    decided = [c for c in figures.comparators if c.status == CONCLUSIVE]
    lowest = min(decided, key=lambda c: (c.parity or 0.0, c.name)).name if decided else None
    adjusted = figures.parity if figures.status == CONCLUSIVE else None
    scores = [float(r.parity_score or 0.0) for r in scored]
    histogram = [0] * BINS
    for score in scores:
        histogram[min(int(max(score, 0.0) * BINS), BINS - 1)] += 1
    # A perfect pair is no divergence, however few imperfect ones there are.
    imperfect = [r for r in scored if float(r.parity_score or 0.0) < 1.0]
    worst = sorted(imperfect, key=lambda r: float(r.parity_score or 0.0))[:WORST]
    return ParitySummary(
        scored=True,
        samples=len(scores),
        mean=sum(scores) / len(scores),
        tool_agreement=_mean([r.parity_tool_agree for r in scored]),
        json_validity=_mean([r.parity_json_valid for r in scored]),
        histogram=tuple(histogram),
        worst=tuple(_divergence(r, store) for r in worst),
        noise_adjusted=adjusted,
        noise_pairs=noise_pairs,
        lowest_comparator=lowest if adjusted is not None else None,
    )


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _mean(values: Sequence[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None and math.isfinite(v)]
    return sum(present) / len(present) if present else None


def _divergence(row: Row, store: RecordStore | None) -> Divergence:
    """The excerpt comes from the stored (already redacted, or full by choice) response."""
    excerpt = ""
    if store is not None:
        found = store.query(
            "SELECT response_json FROM records WHERE request_id = ?", (row.request_id,)
        )
        if found and found[0][0]:
            excerpt = readable(str(found[0][0]))[:EXCERPT_CHARS]
    return Divergence(
        row.request_id, row.conversation, row.turn, float(row.parity_score or 0.0), excerpt
    )


def readable(response_json: str) -> str:
    """What the model said, not the envelope: its text, or the tool calls it made. Any
    shape is read (parity's own reader): an answer the reader does not know (a custom tool
    call, a malformed candidate's) is shown as stored, never a crash of the report."""
    try:
        response = orjson.loads(response_json)
    except orjson.JSONDecodeError:
        return response_json
    if not isinstance(response, dict):
        return response_json
    answer = extract_answer(response)
    calls = answer.tool_calls
    if calls and all(c.name for c in calls):
        return "tool calls: " + "; ".join(f"{c.name}({c.arguments})" for c in calls)
    return answer.refusal or answer.text or ("" if _plain_chat(response) else response_json)


def _plain_chat(response: dict[str, object]) -> bool:
    """A chat answer whose message says nothing (an empty completion): shown empty."""
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    return isinstance(message, dict) and not message.get("tool_calls")
