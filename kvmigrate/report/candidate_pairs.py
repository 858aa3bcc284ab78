"""Candidates against each other: when a request was shadowed to two candidates (a model's
`candidates: [vllm-bf16, vllm-fp8]`), their two answers to it, compared as parity compares
the primary with a candidate (text, topic, tool calls, structured output, finish reason,
...), and their speed and cache use on those same requests side by side.

Every shadow copy records the request id of the primary answer it copies (`pair_id`), so
two copies with the same `pair_id` answer the same request. The recorder scores each copy
against the primary only; this comparison runs here, over the stored answers (so it needs
`record.content` redacted or full: both sides are redacted alike) and the request as the
primary's record holds it. Comparators look for a regression of one side against the
other, so each pair is compared both ways: it agrees only where neither side regressed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from kvmigrate.exchange import Role
from kvmigrate.intervals import wilson, z_for
from kvmigrate.parity.answer import Outcome, read_outcome
from kvmigrate.parity.compare import compare
from kvmigrate.percentile import percentile
from kvmigrate.recorder.history import inflate_rows
from kvmigrate.recorder.store import RecordStore
from kvmigrate.render import fmt
from kvmigrate.report.aggregate import answered, succeeded
from kvmigrate.report.model import CandidatePair
from kvmigrate.report.rows import Row

# Pairs of answers compared (the latest), so a report stays quick: each pair is compared
# both ways (benchmarks/report_cohorts.py measures the cost a pair).
MOST = 2_000
CONFIDENCE = 0.95
_CHUNK = 500  # ids per IN (...) query, under SQLite's variable limit
HEADERS = (
    "candidates (a / b)",
    "requests",
    "agreement (95% interval)",
    "disagreed on",
    "latency p50 (a / b)",
    "TTFT p50 (a / b)",
    "cache hit (a / b)",
)
FOOTNOTE = (
    "Each pair of candidates on the requests both were shadowed: agreement is the share of "
    "those whose two answers agreed on every comparator, compared both ways; the interval "
    "is Wilson's. It needs the answers stored (record.content redacted or full) and "
    f"compares at most the latest {MOST:,} pairs of answers per report."
)


@dataclass(frozen=True, slots=True)
class PairedAnswers:
    """Two candidates' copies of one request; `disagreed` None: not compared (an answer is
    not stored, or the pair is older than the latest MOST)."""

    a: Row
    b: Row
    disagreed: frozenset[str] | None


def paired_answers(rows: Sequence[Row], store: RecordStore | None) -> list[PairedAnswers]:
    """Every two candidates' copies of the same request, both answered, oldest first."""
    copies: dict[str, dict[str, Row]] = defaultdict(dict)
    for row in rows:
        if row.role == Role.SHADOW and row.pair_id is not None and answered(row):
            copies[row.pair_id].setdefault(row.backend, row)
    twins = [
        (pair_id, by[a], by[b])
        for pair_id, by in copies.items()
        for a, b in combinations(sorted(by), 2)
    ]
    twins.sort(key=lambda t: t[1].ts)
    judged = twins[-MOST:]
    stored = _stored(store, {r.request_id for _, a, b in judged for r in (a, b)})
    requests = _requests(store, {pair_id for pair_id, _, _ in judged})
    first_judged = len(twins) - len(judged)
    return [
        PairedAnswers(
            a, b, _disagreed(requests.get(pair_id, {}), a, b, stored) if i >= first_judged else None
        )
        for i, (pair_id, a, b) in enumerate(twins)
    ]


def _disagreed(
    request: dict[str, Any], a: Row, b: Row, stored: dict[str, str]
) -> frozenset[str] | None:
    one, other = _outcome(a, stored), _outcome(b, stored)
    if one is None or other is None:
        return None
    there, back = compare(request, one, other), compare(request, other, one)
    return frozenset(there.disagreements | back.disagreements)


def _outcome(row: Row, stored: dict[str, str]) -> Outcome | None:
    """The answer as parity reads it; None when its body was not stored."""
    if row.status is None:
        return Outcome(None, None)  # no HTTP answer: nothing to store, nothing missing
    body = stored.get(row.request_id)
    if body is None:
        return None
    outcome = read_outcome("chat/completions", body.encode(), row.status)
    if row.error is not None and outcome.error is None:
        # A 200 the proxy judged malformed (broken tool-call JSON, ...) is a failure.
        return Outcome(row.status, outcome.response, {"error": {"type": row.error}})
    return outcome


def _stored(store: RecordStore | None, ids: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    if store is None:
        return out
    for chunk in _chunks(ids):
        marks = ", ".join("?" for _ in chunk)
        sql = (
            f"SELECT request_id, response_json FROM records WHERE request_id IN ({marks}) "
            "AND response_json IS NOT NULL"
        )
        out.update((str(i), str(body)) for i, body in store.query(sql, chunk))
    return out


def _requests(store: RecordStore | None, ids: set[str]) -> dict[str, dict[str, Any]]:
    """The request each primary answer was to (its topic and response format matter)."""
    out: dict[str, dict[str, Any]] = {}
    if store is None:
        return out
    for chunk in _chunks(ids):
        marks = ", ".join("?" for _ in chunk)
        sql = (
            "SELECT request_id, request_json, request_messages FROM records "
            f"WHERE request_id IN ({marks}) AND request_json IS NOT NULL"
        )
        found = store.query(sql, chunk)
        bodies = inflate_rows(store, [(r[1], r[2]) for r in found])
        out.update((str(r[0]), body) for r, body in zip(found, bodies, strict=True) if body)
    return out


def _chunks(ids: set[str]) -> list[list[str]]:
    wanted = sorted(ids)
    return [wanted[i : i + _CHUNK] for i in range(0, len(wanted), _CHUNK)]


def candidate_pairs(paired: Sequence[PairedAnswers]) -> list[CandidatePair]:
    """Per two candidates, in name order."""
    by_pair: dict[tuple[str, str], list[PairedAnswers]] = defaultdict(list)
    for p in paired:
        by_pair[(p.a.backend, p.b.backend)].append(p)
    return [_pair(a, b, found) for (a, b), found in sorted(by_pair.items())]


def _pair(a: str, b: str, found: list[PairedAnswers]) -> CandidatePair:
    judged = [p.disagreed for p in found if p.disagreed is not None]
    agreed = sum(not d for d in judged)
    interval = wilson(agreed, len(judged), z_for(CONFIDENCE)) if judged else None
    counts = Counter(name for d in judged for name in d)
    side_a, side_b = [p.a for p in found], [p.b for p in found]
    # Times are of answers only (aggregate.succeeded), as in the headline.
    timed_a, timed_b = [r for r in side_a if succeeded(r)], [r for r in side_b if succeeded(r)]
    return CandidatePair(
        a=a,
        b=b,
        requests=len(found),
        compared=len(judged),
        agreed=agreed,
        agreement=agreed / len(judged) if judged else None,
        agreement_low=interval.low if interval else None,
        agreement_high=interval.high if interval else None,
        disagreed=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        a_latency_p50_ms=_p50([r.latency_ms for r in timed_a]),
        b_latency_p50_ms=_p50([r.latency_ms for r in timed_b]),
        a_ttft_p50_ms=_p50([r.ttft_ms for r in timed_a]),
        b_ttft_p50_ms=_p50([r.ttft_ms for r in timed_b]),
        a_prompt_tokens=sum(r.prompt_tokens or 0 for r in side_a),
        b_prompt_tokens=sum(r.prompt_tokens or 0 for r in side_b),
        a_cached_tokens=sum(r.cached_tokens or 0 for r in side_a),
        b_cached_tokens=sum(r.cached_tokens or 0 for r in side_b),
    )


def _p50(values: Sequence[float | None]) -> float | None:
    return percentile([v for v in values if v is not None], 50)


def pair_rows(pairs: Sequence[CandidatePair]) -> list[tuple[str, ...]]:
    return [
        (
            f"{p.a} / {p.b}",
            fmt.number(p.requests),
            _agreement(p),
            ", ".join(f"{name} {n:,}" for name, n in p.disagreed.items()) or "-",
            f"{fmt.ms(p.a_latency_p50_ms)} / {fmt.ms(p.b_latency_p50_ms)}",
            f"{fmt.ms(p.a_ttft_p50_ms)} / {fmt.ms(p.b_ttft_p50_ms)}",
            f"{_hit(p.a_cached_tokens, p.a_prompt_tokens)} / "
            f"{_hit(p.b_cached_tokens, p.b_prompt_tokens)}",
        )
        for p in pairs
    ]


def _agreement(p: CandidatePair) -> str:
    if p.agreement is None:
        return "not compared (answers not stored)"
    shown = f"{fmt.pct(p.agreement)} [{fmt.pct(p.agreement_low)}, {fmt.pct(p.agreement_high)}]"
    return f"{shown} of {p.compared:,}"


def _hit(cached: int, prompt: int) -> str:
    return fmt.pct(cached / prompt if prompt else None)
