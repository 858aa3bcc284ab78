"""The pairs behind the parity figure: which shadow copies answered differently, and how.

A shadow copy's record holds the comparators that disagreed with the primary answer it
shadowed (`pair_id` is that answer's request id); a noise call shadowing the same answer
says where the primary disagreed with itself. A comparator the noise call also flagged is
within this request's noise; the others are divergences. Both answers come from the stored
responses (redacted unless `record.content: full`).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from kvmigrate.parity.recording import CANDIDATE_KIND, NOISE_KIND
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report.model import DivergentPair
from kvmigrate.report.parity import readable
from kvmigrate.report.rows import Row

MOST = 200  # pairs the view holds: a report stays a page, not a dump
TEXT_CHARS = 4000
DIVERGED, WITHIN_NOISE = "diverged", "within_noise"
_CHUNK = 500  # ids per IN (...) query, under SQLite's variable limit


def divergent_pairs(
    rows: Sequence[Row], store: RecordStore | None, most: int = MOST
) -> tuple[list[DivergentPair], int]:
    """The `most` worst divergent pairs (beyond noise first, then by score), and how many
    there are in all."""
    noisy: dict[str, frozenset[str]] = {}
    for r in rows:
        if r.parity_kind == NOISE_KIND and r.pair_id is not None:
            noisy[r.pair_id] = noisy.get(r.pair_id, frozenset()) | _names(r.parity_disagree)
    found = []
    for r in rows:
        disagree = _names(r.parity_disagree) if r.parity_kind == CANDIDATE_KIND else frozenset()
        if disagree:
            noise = noisy.get(r.pair_id or "", frozenset())
            found.append((r, tuple(sorted(disagree - noise)), tuple(sorted(disagree & noise))))
    found.sort(key=lambda f: (not f[1], f[0].parity_score or 0.0, f[0].ts))
    chosen = found[:most]
    ids = [r.request_id for r, _, _ in chosen] + [r.pair_id or "" for r, _, _ in chosen]
    texts = _texts(store, ids)
    pairs = [
        DivergentPair(
            request_id=r.request_id,
            conversation=r.conversation,
            turn=r.turn,
            score=float(r.parity_score or 0.0),
            verdict=DIVERGED if beyond else WITHIN_NOISE,
            diverged_on=beyond,
            within_noise=within,
            primary=texts.get(r.pair_id or "", ""),
            candidate=texts.get(r.request_id, ""),
            # The row's cohort (queries.record_cohort), as every table groups it: a
            # record from before cohorts is its model's own, not left out of a filter.
            cohort=r.cohort or None,
            backend=r.backend,
        )
        for r, beyond, within in chosen
    ]
    return pairs, len(found)


def _names(flags: str | None) -> frozenset[str]:
    if not flags:
        return frozenset()
    try:
        names = orjson.loads(flags)
    except orjson.JSONDecodeError:
        return frozenset()
    return frozenset(str(n) for n in names) if isinstance(names, list) else frozenset()


def _texts(store: RecordStore | None, ids: Sequence[str]) -> dict[str, str]:
    """Each record's readable answer, as stored."""
    texts: dict[str, str] = {}
    wanted = sorted({i for i in ids if i})
    if store is None or not wanted:
        return texts
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        marks = ", ".join("?" for _ in chunk)
        sql = f"SELECT request_id, response_json FROM records WHERE request_id IN ({marks})"
        for request_id, response in store.query(sql, chunk):
            texts[request_id] = readable(str(response))[:TEXT_CHARS] if response else ""
    return texts
