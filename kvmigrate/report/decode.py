"""Decode speed by backend and by turn, from the records' decode timing and usage.

Per stream, `policies.decode_speed` turns what the proxy measured into tokens per second
and time per output token; here they are summarised per backend (the arms of a split, or
primary and shadow), by turn, and the candidate's median held against the primary's with
a 95% interval. The median's interval is distribution-free (the order statistics that
bound it); the difference's is Newcombe's MOVER construction from the two."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvmigrate.intervals import Interval, quantile_interval, z_for
from kvmigrate.percentile import percentile
from kvmigrate.policies.decode_speed import StreamSpeed, stream_speed
from kvmigrate.report.aggregate import succeeded, turn_buckets, turn_label
from kvmigrate.report.model import DecodeDifference, DecodeSummary, DecodeTurnRow
from kvmigrate.report.rows import Row

CONFIDENCE = 0.95


def row_speed(row: Row) -> StreamSpeed | None:
    """A record's decode speed; None for one that failed, was not streamed, or lacks usage."""
    if row.error is not None or not succeeded(row):
        return None
    return stream_speed(
        row.completion_tokens, row.decode_ms, row.decode_chunks, row.chunk_gap_max_ms
    )


def decode_summaries(rows: Sequence[Row], backends: Sequence[str]) -> list[DecodeSummary]:
    """One summary per backend that streamed an answer with decode timing."""
    out = []
    for backend in backends:
        timed = [r for r in rows if r.backend == backend and r.decode_ms is not None]
        if timed:
            out.append(_summary(backend, timed))
    return out


def _summary(backend: str, timed: Sequence[Row]) -> DecodeSummary:
    speeds = [s for s in map(row_speed, timed) if s is not None]
    no_usage = sum(r.completion_tokens is None for r in timed)
    tps = sorted(s.tokens_per_s for s in speeds)
    tpot = [s.tpot_ms for s in speeds]
    interval = median_interval(tps)
    return DecodeSummary(
        backend=backend,
        streams=len(speeds),
        no_usage=no_usage,
        tps_p50=percentile(tps, 50),
        tps_p50_low=_finite(interval.low) if tps else None,
        tps_p50_high=_finite(interval.high) if tps else None,
        tps_p10=percentile(tps, 10),
        tpot_p50_ms=percentile(tpot, 50),
        tpot_p95_ms=percentile(tpot, 95),
        gap_p50_ms=percentile([s.gap_mean_ms for s in speeds], 50),
        gap_max_p95_ms=percentile([s.gap_max_ms for s in speeds], 95),
    )


def median_interval(ordered: Sequence[float]) -> Interval:
    """The 95% interval of the median of sorted values (infinite ends where too few)."""
    return quantile_interval(ordered, 0.5, z_for(CONFIDENCE), len(ordered))


def decode_difference(
    summaries: Sequence[DecodeSummary], primary: str, candidate: str
) -> DecodeDifference:
    by_name = {s.backend: s for s in summaries}
    p, c = by_name.get(primary), by_name.get(candidate)
    if p is None or c is None or p.tps_p50 is None or c.tps_p50 is None:
        return DecodeDifference(
            primary=p.tps_p50 if p else None, candidate=c.tps_p50 if c else None
        )
    interval = difference_interval(c.tps_p50, _interval(c), p.tps_p50, _interval(p))
    return DecodeDifference(
        primary=p.tps_p50,
        candidate=c.tps_p50,
        difference=c.tps_p50 - p.tps_p50,
        low=_finite(interval.low),
        high=_finite(interval.high),
    )


def difference_interval(a: float, a_interval: Interval, b: float, b_interval: Interval) -> Interval:
    """Interval for a - b from each one's own (MOVER, Zou and Donner 2008): neither
    sample's spread is ignored, and an unbounded end stays unbounded."""
    down = math.hypot(a - a_interval.low, b_interval.high - b)
    up = math.hypot(a_interval.high - a, b - b_interval.low)
    return Interval(a - b - down, a - b + up)


def _interval(s: DecodeSummary) -> Interval:
    low = -math.inf if s.tps_p50_low is None else s.tps_p50_low
    high = math.inf if s.tps_p50_high is None else s.tps_p50_high
    return Interval(low, high)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def decode_by_turn(
    rows: Sequence[Row], primary: str, candidate: str, max_turn: int = 10
) -> list[DecodeTurnRow]:
    """Median decode speed at each turn; turns beyond `max_turn` share its last row."""
    top = max((r.turn for r in rows), default=0)
    table = []
    for turn, bucket in sorted(turn_buckets(rows, max_turn).items()):
        p = [s for r in bucket if r.backend == primary and (s := row_speed(r)) is not None]
        c = [s for r in bucket if r.backend == candidate and (s := row_speed(r)) is not None]
        if not p and not c:
            continue
        table.append(
            DecodeTurnRow(
                turn_label(turn, max_turn, top),
                len(p),
                percentile([s.tokens_per_s for s in p], 50),
                percentile([s.tpot_ms for s in p], 50),
                len(c),
                percentile([s.tokens_per_s for s in c], 50),
                percentile([s.tpot_ms for s in c], 50),
            )
        )
    return table
