"""The report as one self-contained HTML file: inline CSS, inline SVG charts, works offline."""

from __future__ import annotations

import time

from kvmigrate.html_text import escape
from kvmigrate.render import fmt
from kvmigrate.render.page import SCRIPT, STYLE
from kvmigrate.render.svg import (
    CANDIDATE_COLOR,
    PALETTE,
    PRIMARY_COLOR,
    Axis,
    Series,
    bar_chart,
    line_chart,
    placeholder,
)
from kvmigrate.render.table import html_table
from kvmigrate.report.gpu_chart import gpu_charts
from kvmigrate.report.model import Report
from kvmigrate.report.render_divergences import SCRIPT as DIVERGENCE_SCRIPT
from kvmigrate.report.render_divergences import STYLE as DIVERGENCE_STYLE
from kvmigrate.report.render_divergences import divergences_section
from kvmigrate.report.render_selector import SELECTOR_SCRIPT, SELECTOR_STYLE, cohort_selector
from kvmigrate.report.scorecard import LATE_TARGET_MS
from kvmigrate.report.tables import NOT_SCORED, cohort_lines, report_tables, summary_lines


def render_html(report: Report) -> str:
    """One view per cohort besides the fleet's, when there are several; the selector (or the
    URL, `#view=billing-bot`) shows one at a time and filters the divergences to match."""
    body = [
        "<h1>kvmigrate report</h1>",
        _summary(summary_lines(report)),
        cohort_selector(report),
        _view(report, ""),
        *(_view(c, c.cohort, _summary(cohort_lines(c))) for c in report.cohorts),
        divergences_section(report),
        f'<p class="note">Generated {escape(fmt.when(report.generated_at))}.</p>',
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>kvmigrate report</title>",
            f"<style>{STYLE}{DIVERGENCE_STYLE}{SELECTOR_STYLE}</style></head><body>",
            *body,
            f"<script>{DIVERGENCE_SCRIPT}\n{SELECTOR_SCRIPT}\n{SCRIPT}</script>",
            "</body></html>",
        ]
    )


def _summary(lines: list[str]) -> str:
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return f'<ul class="summary">{items}</ul>'


def _view(report: Report, name: str, head: str = "") -> str:
    """One view's charts and sections; a cohort's starts hidden behind the fleet's."""
    hidden = " hidden" if name else ""
    return "\n".join(
        [
            f'<section class="view" data-view="{escape(name)}"{hidden}>',
            head,
            '<h2>Charts</h2><div class="charts">',
            *charts(report),
            "</div>",
            *(html_table(t) for t in report_tables(report)),
            "</section>",
        ]
    )


def charts(report: Report) -> list[str]:
    return [
        ttft_chart(report),
        cdf_chart(report),
        cache_chart(report),
        parity_chart(report),
        timeline_chart(report),
        *gpu_charts(report),
    ]


def _colors(report: Report) -> dict[str, str]:
    others = [
        b.backend for b in report.backends if b.backend not in (report.primary, report.candidate)
    ]
    colors = {name: PALETTE[(i + 2) % len(PALETTE)] for i, name in enumerate(others)}
    return {**colors, report.primary: PRIMARY_COLOR, report.candidate: CANDIDATE_COLOR}


def _turn_axis(rows: list[str]) -> Axis:
    return Axis(
        "turn", lambda v: rows[int(v) - 1] if 1 <= v <= len(rows) else "", _turn_ticks(rows)
    )


def _turn_ticks(rows: list[str]) -> list[tuple[float, str]]:
    return [(i + 1.0, label) for i, label in enumerate(rows)]


def ttft_chart(report: Report) -> str:
    turns = report.ttft_by_turn
    color = _colors(report)
    series = []
    for name, side in ((report.primary, "primary"), (report.candidate, "candidate")):
        for stat, dashed in (("p50", False), ("p95", True)):
            values = [getattr(t, f"{side}_{stat}_ms") for t in turns]
            points = [(i + 1.0, float(v)) for i, v in enumerate(values) if v is not None]
            series.append(Series(f"{name} {stat}", points, color[name], dashed))
    labels = [t.turn for t in turns]
    y = Axis("TTFT (ms)", lambda v: f"{v:,.0f}")
    # The playbook's flatness target: under 3 s even past 10 turns.
    limit = [(LATE_TARGET_MS, "3 s: the playbook's limit past 10 turns")]
    return line_chart("ttft-by-turn", "TTFT by turn", series, _turn_axis(labels), y, limits=limit)


def cdf_chart(report: Report) -> str:
    color = _colors(report)
    series = [
        Series(name, [(ms, share * 100) for ms, share in points], color.get(name, PALETTE[-1]))
        for name, points in report.latency_cdf.items()
    ]
    x = Axis("total latency (ms)", lambda v: f"{v:,.0f}")
    y = Axis("calls at or below (%)", lambda v: f"{v:.0f}%", top=100.0)
    return line_chart("latency-cdf", "Latency CDF", series, x, y)


def cache_chart(report: Report) -> str:
    rows = report.cache_by_turn
    color = _colors(report)
    series = []
    for b in report.backends:
        points = [
            (i + 1.0, hit * 100)
            for i, r in enumerate(rows)
            if (hit := r.hit.get(b.backend)) is not None
        ]
        series.append(Series(b.backend, points, color.get(b.backend, PALETTE[-1])))
    y = Axis("cached / prompt tokens (%)", lambda v: f"{v:.0f}%", top=100.0)
    axis = _turn_axis([r.turn for r in rows])
    return line_chart("cache-by-turn", "Prefix cache hit by turn", series, axis, y)


def parity_chart(report: Report) -> str:
    p = report.parity
    if not p.scored:
        return placeholder("parity-distribution", "Parity distribution", NOT_SCORED)
    labels = [f"{i / 10:.1f}" for i in range(len(p.histogram))]
    y = Axis("scored pairs", lambda v: f"{v:g}")
    title = "Parity distribution"
    # The scores are the candidate's (against the primary): its colour, not the primary's.
    return bar_chart(
        "parity-distribution", title, labels, list(p.histogram), y, "agreement score",
        CANDIDATE_COLOR,
    )  # fmt: skip


def timeline_chart(report: Report) -> str:
    events = [e for e in report.timeline if e.percent is not None]
    title = "Rollout timeline"
    if not events:
        return placeholder("rollout-timeline", title, "No rollout events in this window.")
    start = events[0].ts
    points = [(e.ts - start, float(e.percent or 0.0)) for e in events]
    end = max(report.until, events[-1].ts) - start
    if end > points[-1][0]:
        points.append((end, points[-1][1]))  # hold the last level until the window's end
    # Minutes repeat over a short window (a demo, a test): show seconds there.
    shape = "%H:%M:%S" if end < 600 else "%m-%d %H:%M"
    x = Axis("time (UTC)", lambda v: time.strftime(shape, time.gmtime(start + v)))
    y = Axis("candidate share (%)", lambda v: f"{v:.0f}%", top=100.0)
    series = [Series(report.candidate, points, _colors(report)[report.candidate])]
    return line_chart("rollout-timeline", title, series, x, y, step=True)
