"""Build a Report from a records database over a time window."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from kvmigrate.config import safe_url
from kvmigrate.exchange import Role
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report.aggregate import (
    backend_summaries,
    cache_by_turn,
    latency_cdf,
    shadow_coverage,
    ttft_by_turn,
)
from kvmigrate.report.busters import cache_busters
from kvmigrate.report.candidate_pairs import PairedAnswers, candidate_pairs, paired_answers
from kvmigrate.report.candidates import parity_by_candidate
from kvmigrate.report.cohorts import (
    cohort_candidate,
    cohort_timeline,
    outside_cohorts,
    split_by_cohort,
)
from kvmigrate.report.completeness import completeness
from kvmigrate.report.cost import project_cost
from kvmigrate.report.decode import decode_by_turn, decode_difference, decode_summaries
from kvmigrate.report.divergences import divergent_pairs
from kvmigrate.report.engine_use import engine_use
from kvmigrate.report.evaluate import slow_conversations
from kvmigrate.report.flatness import flatness
from kvmigrate.report.gpu import ScrapeSetup
from kvmigrate.report.identity import identity_notes, identity_summary
from kvmigrate.report.model import CacheBusters, Prices, Report, TimelineEvent
from kvmigrate.report.parity import parity_summary
from kvmigrate.report.rows import Row, fetch_rows
from kvmigrate.report.scorecard import scorecard
from kvmigrate.report.users import (
    SLOW_TURN_MS,
    Score,
    UsersFigures,
    fetch_scores,
    users_figures,
)

TINY = 20  # fewer answered calls than this: say the figures are anecdotes


def build_report(
    store: RecordStore | None,
    since: float,
    until: float | None = None,
    primary: str = "hosted",
    candidate: str = "vllm",
    prices: Prices | None = None,
    timeline: Sequence[TimelineEvent] = (),
    database: str = "",
    max_turn: int = 10,
    candidates_of: Mapping[str, Sequence[str]] | None = None,
    slow_turn_ms: float = SLOW_TURN_MS,
    gpu: ScrapeSetup | None = None,
) -> Report:
    """`store` None stands for a database that does not exist yet: an empty report.
    `candidates_of`: each cohort of the config and its candidates (config.candidates_of),
    the first of which its own report holds against the primary. Given, only those cohorts
    get a view: a model without a rollout (embeddings on the primary only) is no cohort,
    and its traffic counts in the fleet's figures alone. None: every recorded group does,
    against `candidate`. `slow_turn_ms`: a turn slower than this (TTFT) is slow, for the
    users section's abandonment figure. `gpu`: the config's scrape setup, for the GPU, KV
    and cost-per-token figures (report.engine_use), which the scorecard reads too; None
    leaves them out."""
    until = time.time() if until is None else until
    report = Report(
        generated_at=time.time(),
        since=since,
        until=until,
        database=safe_url(database or (store.url if store else "")),
        primary=primary,
        candidate=candidate,
        timeline=sorted(timeline, key=lambda e: e.ts),
    )
    recorded, _ = fetch_rows(store, since, until) if store is not None else ([], False)
    if store is not None:
        report.completeness = completeness(store, since, until)
    prices = prices or Prices()
    cohorts = split_by_cohort(recorded)
    paired = paired_answers(recorded, store)
    busters: tuple[CacheBusters, dict[str, CacheBusters]] = (CacheBusters(), {})
    if store is not None and recorded:
        cohort_of = {r.request_id: r.cohort for r in recorded} if len(cohorts) > 1 else {}
        busters = cache_busters(store, since, until, cohort_of)
    _fill(report, recorded, store, prices, max_turn, paired)
    scores = fetch_scores(store, since, until) if store is not None else ([], {})
    report.users = _users(report, recorded, scores, slow_turn_ms)
    if gpu is not None:
        served = [r for r in recorded if r.role != Role.NOISE]
        report.gpu, report.cost_per_token = engine_use(
            store, served, since, until, primary, candidate, prices, gpu
        )
    report.cache_busters = busters[0]
    report.divergences, report.divergent_total = divergent_pairs(recorded, store)
    report.scorecard = scorecard(report)
    if candidates_of is not None:
        cohorts = {name: rows for name, rows in cohorts.items() if name in candidates_of}
    if len(cohorts) < 2 or report.empty:
        return report
    report.notes.extend(outside_cohorts(recorded, cohorts))
    for name, rows in cohorts.items():
        own = _cohort_view(report, name, cohort_candidate(candidates_of or {}, name, candidate))
        _fill(own, rows, store, prices, max_turn, [p for p in paired if p.a.cohort == name])
        own.cache_busters = busters[1].get(name, CacheBusters())
        own.divergent_total = divergent_pairs(rows, None, most=0)[1]
        own.users = _users(own, rows, scores, slow_turn_ms)
        report.cohorts.append(own)
    return report


def _users(
    report: Report,
    rows: Sequence[Row],
    scores: tuple[Sequence[Score], Mapping[str, str]],
    slow_turn_ms: float,
) -> UsersFigures:
    return users_figures(
        rows,
        *scores,
        primary=report.primary,
        candidate=report.candidate,
        until=report.until,
        slow_turn_ms=slow_turn_ms,
    )


def _cohort_view(fleet: Report, cohort: str, candidate: str) -> Report:
    """A cohort's report before its sections are filled: the fleet's window, its own
    candidate and timeline, and the fleet's worst divergent pairs that are its own (the
    HTML view filters the one list)."""
    return Report(
        generated_at=fleet.generated_at,
        since=fleet.since,
        until=fleet.until,
        database=fleet.database,
        primary=fleet.primary,
        candidate=candidate,
        timeline=cohort_timeline(fleet.timeline, cohort),
        divergences=[d for d in fleet.divergences if d.cohort == cohort],
        cohort=cohort,
    )


def _fill(
    report: Report,
    recorded: Sequence[Row],
    store: RecordStore | None,
    prices: Prices,
    max_turn: int,
    paired: Sequence[PairedAnswers],
) -> None:
    """Every section but cache busters and divergences (the caller shares them out), from
    the rows of the whole fleet or of one cohort."""
    primary, candidate = report.primary, report.candidate
    # Noise calls (the primary asked twice, for parity) are not client traffic: they count
    # for parity only, never for latency, cache or cost figures.
    rows = [r for r in recorded if r.role != Role.NOISE]
    report.cost = project_cost(rows, candidate, prices)
    report.slow_conversations = slow_conversations(rows, prices)
    report.records = len(recorded)
    report.noise_calls = len(recorded) - len(rows)
    if not rows:
        report.notes.append("No records in this window: nothing to report yet.")
        return
    report.first_ts, report.last_ts = rows[0].ts, rows[-1].ts
    report.backends = backend_summaries(rows, (primary, candidate))
    names = [b.backend for b in report.backends]
    report.coverage = shadow_coverage(rows, primary, candidate)
    report.ttft_by_turn = ttft_by_turn(rows, primary, candidate, max_turn)
    report.cache_by_turn = cache_by_turn(rows, names, max_turn)
    report.latency_cdf = latency_cdf(rows, names)
    report.decode = decode_summaries(rows, names)
    report.decode_difference = decode_difference(report.decode, primary, candidate)
    report.decode_by_turn = decode_by_turn(rows, primary, candidate, max_turn)
    report.flatness = flatness(rows, names)
    report.parity = parity_summary(recorded, store)
    report.parity_by_candidate = parity_by_candidate(recorded)
    report.candidate_pairs = candidate_pairs(paired)
    report.identity = identity_summary(rows)
    report.notes.extend(_notes(report))
    report.notes.extend(identity_notes(report.identity))


def _notes(report: Report) -> list[str]:
    notes = []
    calls = sum(b.requests for b in report.backends)
    if calls < TINY:
        notes.append(f"Only {calls} recorded calls: treat every figure below as anecdotal.")
    if report.cost.hosted_monthly_usd is not None and report.cost.basis_s < 3600:
        span = f"{report.cost.basis_s:.0f} s"
        notes.append(f"The cost projection scales {span} of traffic to a month: an estimate only.")
    names = {b.backend for b in report.backends}
    if not report.candidate:
        notes.append(
            "No candidate (rollout.mode: observe): the primary measured alone, before any "
            "self-hosted model; see the slowest conversations and what caching would save."
        )
    for name, role in ((report.primary, "primary"), (report.candidate, "candidate")):
        if name and name not in names:
            notes.append(f"No traffic from the {role} `{name}` in this window.")
    return notes
