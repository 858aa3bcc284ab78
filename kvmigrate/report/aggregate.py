"""Aggregations over recorded rows: per backend, per turn, shadow coverage, latency CDF."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from kvmigrate.exchange import Role
from kvmigrate.intervals import quantile_interval, z_for
from kvmigrate.percentile import percentile
from kvmigrate.policies.outcome import is_backend_error, latency_counts
from kvmigrate.report.identity import count_conversations
from kvmigrate.report.model import BackendSummary, CacheRow, Coverage, TurnRow
from kvmigrate.report.rows import Row

CDF_POINTS = 100


def answered(row: Row) -> bool:
    return row.status is not None or row.error is not None


def succeeded(row: Row) -> bool:
    """An answer, not a failure (`outcome.latency_counts`): records written before the
    recorder left an error status's TTFT out still carry one."""
    return latency_counts(row.status, row.error)


def backend_summaries(rows: Sequence[Row], order: Sequence[str]) -> list[BackendSummary]:
    """Serve and shadow calls both count for the backend that made them."""
    by_backend: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if answered(row):
            by_backend[row.backend].append(row)
    names = [b for b in order if b in by_backend] + sorted(set(by_backend) - set(order))
    return [_summary(name, by_backend[name]) for name in names]


def _summary(backend: str, rows: list[Row]) -> BackendSummary:
    s = BackendSummary(backend)
    s.serve = sum(r.role == Role.SERVE for r in rows)
    s.shadow = sum(r.role == Role.SHADOW for r in rows)
    s.conversations = count_conversations(rows)
    s.errors = sum(is_backend_error(r.status, r.error) for r in rows)
    s.error_rate = s.errors / len(rows) if rows else None
    timed = [r for r in rows if succeeded(r)]
    ttfts = [r.ttft_ms for r in timed if r.ttft_ms is not None]
    latencies = [r.latency_ms for r in timed if r.latency_ms is not None]
    s.ttft_p50_ms, s.ttft_p95_ms = percentile(ttfts, 50), percentile(ttfts, 95)
    s.ttft_n = len(ttfts)
    s.ttft_p50_low_ms, s.ttft_p50_high_ms = _quantile_bounds(ttfts, 0.5)
    s.ttft_p95_low_ms, s.ttft_p95_high_ms = _quantile_bounds(ttfts, 0.95)
    s.latency_p50_ms, s.latency_p95_ms = percentile(latencies, 50), percentile(latencies, 95)
    s.prompt_tokens = sum(r.prompt_tokens or 0 for r in rows)
    s.cached_tokens = sum(r.cached_tokens or 0 for r in rows)
    s.completion_tokens = sum(r.completion_tokens or 0 for r in rows)
    return s


def _quantile_bounds(values: Sequence[float], q: float) -> tuple[float | None, float | None]:
    """The 95% distribution-free interval of the q-quantile; None for an unbounded end."""
    if not values:
        return None, None
    interval = quantile_interval(sorted(values), q, z_for(0.95), len(values))
    low = interval.low if math.isfinite(interval.low) else None
    return low, interval.high if math.isfinite(interval.high) else None


def shadow_coverage(rows: Sequence[Row], primary: str, candidate: str) -> Coverage:
    served = [r for r in rows if r.role == Role.SERVE and r.backend == primary and answered(r)]
    shadowed_ids = {r.pair_id for r in rows if r.role == Role.SHADOW and r.backend == candidate}
    shadowed = [r for r in served if r.request_id in shadowed_ids]
    conversations = {r.conversation for r in served}
    shadowed_conversations = {r.conversation for r in shadowed}
    return Coverage(
        primary_requests=len(served),
        shadowed_requests=len(shadowed),
        request_ratio=len(shadowed) / len(served) if served else None,
        primary_conversations=len(conversations),
        shadowed_conversations=len(shadowed_conversations),
        conversation_ratio=len(shadowed_conversations) / len(conversations)
        if conversations
        else None,
    )


def turn_buckets(rows: Iterable[Row], max_turn: int) -> dict[int, list[Row]]:
    buckets: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        if answered(row):
            buckets[min(max(row.turn, 1), max_turn)].append(row)
    return buckets


def turn_label(turn: int, max_turn: int, top: int) -> str:
    return f"{turn}+" if turn == max_turn and top > max_turn else str(turn)


def ttft_by_turn(
    rows: Sequence[Row], primary: str, candidate: str, max_turn: int = 10
) -> list[TurnRow]:
    """The seed's table for real traffic: turns beyond `max_turn` share its last row."""
    top = max((r.turn for r in rows), default=0)
    buckets = turn_buckets(rows, max_turn)
    table = []
    for turn in sorted(buckets):
        timed = [r for r in buckets[turn] if succeeded(r)]
        p = [r.ttft_ms for r in timed if r.backend == primary and r.ttft_ms is not None]
        c = [r.ttft_ms for r in timed if r.backend == candidate and r.ttft_ms is not None]
        p50, p95 = percentile(p, 50), percentile(p, 95)
        c50, c95 = percentile(c, 50), percentile(c, 95)
        label = turn_label(turn, max_turn, top)
        reductions = _reduction(p50, c50), _reduction(p95, c95)
        table.append(TurnRow(label, len(p), p50, p95, len(c), c50, c95, *reductions))
    return table


def _reduction(primary: float | None, candidate: float | None) -> float | None:
    if primary is None or candidate is None or primary <= 0:
        return None
    return (primary - candidate) / primary * 100.0


def cache_by_turn(
    rows: Sequence[Row], backends: Sequence[str], max_turn: int = 10
) -> list[CacheRow]:
    top = max((r.turn for r in rows), default=0)
    buckets = turn_buckets(rows, max_turn)
    table = []
    for turn in sorted(buckets):
        hit: dict[str, float | None] = {}
        for backend in backends:
            used = [r for r in buckets[turn] if r.backend == backend and r.prompt_tokens]
            prompt = sum(r.prompt_tokens or 0 for r in used)
            hit[backend] = sum(r.cached_tokens or 0 for r in used) / prompt if prompt else None
        table.append(CacheRow(turn_label(turn, max_turn, top), hit))
    return table


def latency_cdf(
    rows: Sequence[Row], backends: Sequence[str]
) -> dict[str, list[tuple[float, float]]]:
    """Per backend, (latency ms, share of calls at or below it), at most CDF_POINTS points."""
    out: dict[str, list[tuple[float, float]]] = {}
    for backend in backends:
        values = sorted(
            r.latency_ms
            for r in rows
            if r.backend == backend and r.latency_ms is not None and succeeded(r)
        )
        if not values:
            continue
        n = len(values)
        step = max(1, n // CDF_POINTS)
        indexes = list(range(step - 1, n, step))
        if indexes[-1] != n - 1:
            indexes.append(n - 1)
        out[backend] = [(round(values[i], 3), round((i + 1) / n, 4)) for i in indexes]
    return out
