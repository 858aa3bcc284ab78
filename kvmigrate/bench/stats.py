"""Per-turn figures of a benchmark run, and the comparison of two runs.

Per turn: TTFT and total latency at p50 and p95, decode speed (output tokens per second
after the first token), and the mean prompt and cached tokens when the server reports them.
Percentiles interpolate linearly between the closest ranks (numpy's default), so a p95 of a
few samples is the top of the range rather than an arbitrary sample.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvmigrate.bench.runner import BenchRun, TurnRecord
from kvmigrate.config import safe_url
from kvmigrate.percentile import percentile as shared_percentile


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `values`, interpolated; NaN when empty (the bench's
    tables print NaN cells as missing)."""
    value = shared_percentile(values, q)
    return math.nan if value is None else value


@dataclass(frozen=True, slots=True)
class TurnStats:
    turn: int
    requests: int
    errors: int
    ttft_p50: float
    ttft_p95: float
    latency_p50: float
    latency_p95: float
    tokens_per_s: float  # median decode speed: (completion - 1) / (latency - TTFT)
    prompt_tokens: float | None  # mean
    cached_tokens: float | None  # mean; None when the server reports none

    @property
    def cached_share(self) -> float | None:
        if self.cached_tokens is None or not self.prompt_tokens:
            return None
        return self.cached_tokens / self.prompt_tokens


@dataclass(frozen=True, slots=True)
class Summary:
    label: str
    base_url: str
    model: str
    turns: tuple[TurnStats, ...]
    requests: int
    errors: int
    wall_s: float
    # Every answer's output tokens over the run's wall time, all streams together: what
    # the endpoint sustained at this concurrency, the figure a cost projection needs.
    output_tokens: int = 0

    @property
    def output_tokens_per_s(self) -> float | None:
        return self.output_tokens / self.wall_s if self.output_tokens and self.wall_s > 0 else None

    def turn(self, number: int) -> TurnStats | None:
        return next((t for t in self.turns if t.turn == number), None)


def _mean(values: Iterable[int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _decode_speed(record: TurnRecord) -> float | None:
    if record.completion_tokens is None or record.ttft_s is None or record.latency_s is None:
        return None
    decode_s = record.latency_s - record.ttft_s
    if record.completion_tokens < 2 or decode_s <= 0:
        return None
    return (record.completion_tokens - 1) / decode_s


def turn_stats(turn: int, records: Sequence[TurnRecord]) -> TurnStats:
    ok = [r for r in records if r.error is None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    latencies = [r.latency_s for r in ok if r.latency_s is not None]
    speeds = [s for s in map(_decode_speed, ok) if s is not None]
    return TurnStats(
        turn=turn,
        requests=len(records),
        errors=len(records) - len(ok),
        ttft_p50=percentile(ttfts, 50),
        ttft_p95=percentile(ttfts, 95),
        latency_p50=percentile(latencies, 50),
        latency_p95=percentile(latencies, 95),
        tokens_per_s=statistics.median(speeds) if speeds else math.nan,
        prompt_tokens=_mean(r.prompt_tokens for r in ok),
        cached_tokens=_mean(r.cached_tokens for r in ok),
    )


def summarize(run: BenchRun) -> Summary:
    by_turn: dict[int, list[TurnRecord]] = {}
    for record in run.records:
        by_turn.setdefault(record.turn, []).append(record)
    turns = tuple(turn_stats(t, by_turn[t]) for t in sorted(by_turn))
    return Summary(
        # Printed and written to JSON: never a password or key a URL holds.
        label=safe_url(run.target.label or run.target.base_url),
        base_url=safe_url(run.target.base_url),
        model=run.model,
        turns=turns,
        requests=len(run.records),
        errors=sum(t.errors for t in turns),
        wall_s=run.wall_s,
        output_tokens=sum(r.completion_tokens or 0 for r in run.records if r.error is None),
    )


def reduction(value: float, baseline: float) -> float:
    """How much lower `value` is than `baseline`, in percent (negative: higher)."""
    if math.isnan(value) or math.isnan(baseline) or baseline <= 0:
        return math.nan
    return (baseline - value) / baseline * 100.0
