"""Read-side queries over the records that other parts need (rollout gates, the report)."""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.parity.recording import NOISE_KIND, flag_aggregator
from kvmigrate.percentile import percentile
from kvmigrate.policies.decode_speed import stream_speed
from kvmigrate.policies.outcome import is_backend_error, latency_counts, ttft_counts
from kvmigrate.policies.window import RESERVOIR, BackendWindow, ComparatorCounts
from kvmigrate.recorder.store import RecordStore, open_store

# Passthrough calls (/v1/models, files, ...) are recorded but are not model traffic; nor is
# Anthropic's count_tokens, which generates nothing (no TTFT, no cache, no cost).
MODEL_TRAFFIC = "route NOT IN ('other', 'messages/count_tokens')"


def record_cohort(columns: Collection[str]) -> str:
    """SQL for the cohort a record belongs to: the one it was routed in, or, for a record
    written before cohorts (migration m008, `cohort` NULL or no such column), its model's
    own cohort. Every read that groups or filters records by cohort uses this one."""
    return "COALESCE(cohort, model)" if "cohort" in columns else "model"


# A client that hung up is not the backend's failure; neither is a 4xx.
@dataclass
class _Tally:
    requests: int = 0
    errors: int = 0
    conversations: set[str] = field(default_factory=set)
    ttfts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    speeds: list[float] = field(default_factory=list)  # tokens per second per stream
    parity_flags: list[tuple[str | None, str | None, str | None]] = field(default_factory=list)
    first_ts: float | None = None
    last_ts: float | None = None


def window_stats(
    store_or_url: RecordStore | str,
    since: float,
    until: float | None = None,
    roles: Sequence[str] | None = None,
    min_noise_samples: int = 20,
    cohort: str = "",
    model: str = "",
) -> dict[str, BackendWindow]:
    """Per backend figures over records that started in [since, until) (Unix seconds).

    Serve and shadow calls both count for the backend that made them, unless `roles`
    narrows it: in shadow mode the candidate only ever answers shadow copies, and its
    TTFT there is exactly the figure a promotion gate needs. A request counts when it
    reached a verdict (a status or a transport error). `parity` is the noise-adjusted
    figure: the backend's scored copies against the primary's own disagreement with itself
    (noise calls), None until enough noise pairs are in. `cohort`: that cohort's records
    only; with `model`, the cohort is that model's own, which also holds the model's records
    from before cohorts (no cohort recorded)."""
    with ExitStack() as stack:
        store = store_or_url
        if isinstance(store, str):
            store = stack.enter_context(open_store(store))
        rows = store.query(*_window_sql(since, until, roles, cohort, model))
    tallies: dict[str, _Tally] = {}
    noise: list[tuple[str | None, str | None, str | None]] = []
    for (
        backend,
        conversation,
        status,
        error,
        ttft_ms,
        latency_ms,
        kind,
        applicable,
        disagree,
        ts,
        completion_tokens,
        decode_ms,
        decode_chunks,
        gap_ms,
    ) in rows:
        tally = tallies.setdefault(backend, _Tally())
        tally.first_ts = ts if tally.first_ts is None else min(tally.first_ts, ts)
        tally.last_ts = ts if tally.last_ts is None else max(tally.last_ts, ts)
        if kind == NOISE_KIND:
            noise.append((kind, applicable, disagree))
        elif kind is not None:
            tally.parity_flags.append((kind, applicable, disagree))
        if status is None and error is None:
            continue
        tally.requests += 1
        tally.conversations.add(conversation)
        tally.errors += is_backend_error(status, error)
        if ttft_ms is not None and ttft_counts(status):  # records written before it was so
            tally.ttfts.append(ttft_ms / 1000.0)
        if latency_ms is not None and latency_counts(status, error):  # a fast 503 is no speed
            tally.latencies.append(latency_ms / 1000.0)
        if error is None and decode_ms is not None and ttft_counts(status):
            speed = stream_speed(completion_tokens, decode_ms, decode_chunks, gap_ms)
            if speed is not None:
                tally.speeds.append(speed.tokens_per_s)
    return {
        backend: _window(backend, t, noise, min_noise_samples)
        for backend, t in sorted(tallies.items())
    }


def _window_sql(
    since: float, until: float | None, roles: Sequence[str] | None, cohort: str, model: str
) -> tuple[str, list[Any]]:
    sql = (
        "SELECT backend, conversation, status, error, ttft_ms, latency_ms, parity_kind, "
        "parity_applicable, "
        "parity_disagree, ts, completion_tokens, decode_ms, decode_chunks, chunk_gap_max_ms "
        f"FROM records WHERE ts >= ? AND ts < ? AND {MODEL_TRAFFIC}"
    )
    params: list[Any] = [since, time.time() + 1e9 if until is None else until]
    if roles:
        sql += f" AND role IN ({', '.join('?' for _ in roles)})"
        params.extend(roles)
    if cohort and model:
        sql += " AND (cohort = ? OR (cohort IS NULL AND model = ?))"
        params += [cohort, model]
    elif cohort:
        sql += " AND cohort = ?"
        params.append(cohort)
    return sql, params


def _window(
    backend: str,
    t: _Tally,
    noise: list[tuple[str | None, str | None, str | None]],
    min_noise_samples: int,
) -> BackendWindow:
    parity, samples, noise_pairs = None, 0, 0
    comparators: tuple[ComparatorCounts, ...] = ()
    if t.parity_flags:
        aggregator, noise_pairs = flag_aggregator([*t.parity_flags, *noise], min_noise_samples)
        parity, samples = aggregator.window_figures()
        comparators = tuple(
            ComparatorCounts(
                c.name, c.candidate_n, c.candidate_disagree, c.noise_n, c.noise_disagree
            )
            for c in aggregator.report().comparators
        )
    return BackendWindow(
        backend=backend,
        requests=t.requests,
        conversations=len(t.conversations),
        errors=t.errors,
        ttft_p50=percentile(t.ttfts, 50),
        ttft_p95=percentile(t.ttfts, 95),
        parity=parity,
        parity_samples=samples,
        latency_p95=percentile(t.latencies, 95),
        noise_pairs=noise_pairs,
        noise_needed=min_noise_samples,
        span_s=(t.last_ts or 0.0) - (t.first_ts or 0.0),
        ttft_sample=_reservoir(t.ttfts),
        latency_sample=_reservoir(t.latencies),
        tps_sample=_reservoir(t.speeds),
        comparators=comparators,
    )


def _reservoir(values: list[float]) -> tuple[float, ...]:
    """All the values, or a uniform sample of RESERVOIR of them (seeded: the same records
    give the same gate verdict every time)."""
    if len(values) <= RESERVOIR:
        return tuple(values)
    return tuple(random.Random(len(values)).sample(values, RESERVOIR))
