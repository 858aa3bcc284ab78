"""A benchmark's summary as a text table and as JSON.

The table has one row per turn. With a second run (`--vs`) it adds that run's TTFT columns
and the TTFT p50 reduction of the first run against it, which is the number the migration
is about: how much sooner the first token comes from the cached engine.
"""

from __future__ import annotations

import math
from typing import Any

from kvmigrate.bench.stats import Summary, TurnStats, reduction


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def _num(value: float, digits: int = 0) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _cached(stats: TurnStats) -> str:
    if stats.prompt_tokens is None:
        return "-"
    if stats.cached_tokens is None:
        return f"?/{stats.prompt_tokens:.0f}"
    return f"{stats.cached_tokens:.0f}/{stats.prompt_tokens:.0f}"


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:+.0f}%"


def table(summary: Summary, vs: Summary | None = None) -> str:
    """Aligned text: turn | n | TTFT p50 | p95 | total p50 | p95 | tok/s | cached/prompt."""
    header = ["turn", "n", "TTFT p50", "p95", "total p50", "p95", "tok/s", "cached/prompt"]
    if vs is not None:
        header += ["vs TTFT p50", "vs p95", "vs cached/prompt", "TTFT reduction"]
    rows = [header]
    for stats in summary.turns:
        row = [
            str(stats.turn),
            f"{stats.requests - stats.errors}" + (f" ({stats.errors} err)" if stats.errors else ""),
            _ms(stats.ttft_p50),
            _ms(stats.ttft_p95),
            _ms(stats.latency_p50),
            _ms(stats.latency_p95),
            _num(stats.tokens_per_s),
            _cached(stats),
        ]
        if vs is not None:
            other = vs.turn(stats.turn)
            if other is None:
                row += ["-", "-", "-", "-"]
            else:
                row += [
                    _ms(other.ttft_p50),
                    _ms(other.ttft_p95),
                    _cached(other),
                    _pct(reduction(stats.ttft_p50, other.ttft_p50)),
                ]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    title = f"{summary.label} ({summary.model})"
    if vs is not None:
        title += f"  vs  {vs.label} ({vs.model})"
    footer = f"times in ms; {summary.requests} requests, {summary.errors} errors, " + (
        f"{summary.wall_s:.1f} s"
    )
    if vs is not None:
        footer += f"; vs: {vs.requests} requests, {vs.errors} errors, {vs.wall_s:.1f} s"
    return "\n".join([title, *lines, footer, *_throughput(summary)])


def _throughput(summary: Summary) -> list[str]:
    rate = summary.output_tokens_per_s
    if rate is None:
        return []
    return [
        f"output {rate:.1f} tokens/s, all streams together: pass it to `kvmigrate report "
        "--gpu-tokens-per-s` for the cost projection (per GPU; raise --concurrency until TTFT "
        "suffers for the most one sustains)"
    ]


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 6)


def turn_json(stats: TurnStats) -> dict[str, Any]:
    return {
        "turn": stats.turn,
        "requests": stats.requests,
        "errors": stats.errors,
        "ttft_p50_s": _finite(stats.ttft_p50),
        "ttft_p95_s": _finite(stats.ttft_p95),
        "latency_p50_s": _finite(stats.latency_p50),
        "latency_p95_s": _finite(stats.latency_p95),
        "output_tokens_per_s": _finite(stats.tokens_per_s),
        "prompt_tokens": _finite(stats.prompt_tokens),
        "cached_tokens": _finite(stats.cached_tokens),
    }


def summary_json(summary: Summary) -> dict[str, Any]:
    return {
        "label": summary.label,
        "base_url": summary.base_url,
        "model": summary.model,
        "requests": summary.requests,
        "errors": summary.errors,
        "wall_s": round(summary.wall_s, 3),
        "output_tokens_per_s": _finite(summary.output_tokens_per_s),
        "turns": [turn_json(t) for t in summary.turns],
    }


def report_json(summary: Summary, vs: Summary | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {"run": summary_json(summary)}
    if vs is not None:
        report["vs"] = summary_json(vs)
        report["ttft_p50_reduction_pct"] = {
            str(t.turn): _finite(reduction(t.ttft_p50, other.ttft_p50))
            for t in summary.turns
            if (other := vs.turn(t.turn)) is not None
        }
    return report
