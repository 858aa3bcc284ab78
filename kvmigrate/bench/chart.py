"""A self-contained HTML page: TTFT per turn as an inline SVG line chart, and the table.

No script and no CDN: the file opens anywhere, offline, and can be attached to a CI run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvmigrate.bench.render import table
from kvmigrate.bench.stats import Summary
from kvmigrate.html_text import escape
from kvmigrate.render.svg import CANDIDATE_COLOR, PRIMARY_COLOR

WIDTH, HEIGHT = 720, 360
LEFT, RIGHT, TOP, BOTTOM = 64, 24, 24, 48
# The measured endpoint (--base-url, the self-hosted candidate) and --vs (the hosted API)
# in the report's colours for those roles.
COLOURS = (CANDIDATE_COLOR, PRIMARY_COLOR)


def _nice_ceiling(value: float) -> float:
    """The next round number (1, 2 or 5 times a power of ten) at or above `value`."""
    if value <= 0 or math.isnan(value):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return 10.0 * power


def _series(summary: Summary, quantile: str) -> list[tuple[int, float]]:
    points = []
    for stats in summary.turns:
        value = stats.ttft_p50 if quantile == "p50" else stats.ttft_p95
        if not math.isnan(value):
            points.append((stats.turn, value * 1000))
    return points


def svg_chart(runs: Sequence[Summary]) -> str:
    """TTFT p50 (solid) and p95 (dashed) in ms against the turn, one colour per run."""
    series = [(i, q, _series(run, q)) for i, run in enumerate(runs) for q in ("p50", "p95")]
    turns = [t for _, _, pts in series for t, _ in pts] or [1]
    top = _nice_ceiling(max((v for _, _, pts in series for _, v in pts), default=1.0))
    first, last = min(turns), max(turns)
    span = max(last - first, 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(turn: float) -> float:
        return LEFT + (turn - first) / span * plot_w

    def y(ms: float) -> float:
        return TOP + plot_h - ms / top * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#ccc"/>',
    ]
    for k in range(5):
        value = top * k / 4
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="#eee"/><text x="{LEFT - 6}" y="{y(value) + 4:.1f}" '
            f'text-anchor="end">{value:g}</text>'
        )
    for turn in range(first, last + 1):
        parts.append(
            f'<text x="{x(turn):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{turn}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 8}" text-anchor="middle">turn</text>'
        f'<text transform="translate(14 {TOP + plot_h / 2}) rotate(-90)" '
        'text-anchor="middle">TTFT (ms)</text>'
    )
    for index, quantile, points in series:
        if not points:
            continue
        colour = COLOURS[index % len(COLOURS)]
        dash = ' stroke-dasharray="5 4"' if quantile == "p95" else ""
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        label = escape(f"{runs[index].label} TTFT {quantile}")
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{path}">'
            f"<title>{label}</title></polyline>"
        )
        for t, v in points:
            parts.append(
                f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}">'
                f"<title>{label}, turn {t}: {v:.0f} ms</title></circle>"
            )
    parts.append("</svg>")
    return "\n".join(parts)


def html_report(summary: Summary, vs: Summary | None = None) -> str:
    runs = [summary] if vs is None else [summary, vs]
    legend = "".join(
        f'<li><span style="color:{COLOURS[i]}">&#9632;</span> {escape(r.label)} '
        f"({escape(r.model)})</li>"
        for i, r in enumerate(runs)
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>kvmigrate bench: TTFT per turn</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}} ul{{list-style:none;padding:0}}
pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}</style></head>
<body>
<h1>TTFT per turn</h1>
<p>Solid: p50; dashed: p95. Every turn resends the whole conversation so far.</p>
<ul>{legend}</ul>
{svg_chart(runs)}
<h2>Figures</h2>
<pre>{escape(table(summary, vs))}</pre>
</body></html>
"""
