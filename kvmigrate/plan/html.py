"""A plan as one self-contained HTML page: the report's style, inline SVG charts of fleet
size against TTFT p95 and against monthly cost, and the plan's tables."""

from __future__ import annotations

from kvmigrate.html_text import escape
from kvmigrate.plan.sweep import Plan
from kvmigrate.plan.tables import focus, plan_tables, summary_lines
from kvmigrate.render import fmt
from kvmigrate.render.page import SCRIPT, STYLE
from kvmigrate.render.svg import PALETTE, Axis, Series, line_chart
from kvmigrate.render.table import html_table


def _replica_axis(plan: Plan) -> Axis:
    sizes = [s.replicas for s in plan.sizes]
    ticks = [(float(n), str(n)) for n in sizes] if len(sizes) <= 16 else None
    return Axis("replicas", lambda v: f"{v:.0f}", ticks=ticks)


def ttft_chart(plan: Plan) -> str:
    p95 = [(float(s.replicas), s.ttft_p95_s * 1000) for s in plan.sizes]
    p50 = [(float(s.replicas), s.ttft_p50_s * 1000) for s in plan.sizes]
    series = [Series("TTFT p95", p95, PALETTE[0]), Series("TTFT p50", p50, PALETTE[1])]
    if plan.slo_p95_s is not None:
        slo = plan.slo_p95_s * 1000
        ends = [(p95[0][0], slo), (p95[-1][0], slo)]
        series.append(Series("SLO", ends, PALETTE[3], dashed=True))
    y = Axis("TTFT (ms)", lambda v: f"{v:,.0f}")
    return line_chart("plan-ttft", "TTFT by fleet size", series, _replica_axis(plan), y)


def cost_chart(plan: Plan) -> str:
    costs = plan.costs
    fleet = [(float(s.replicas), costs.monthly_usd(s.replicas)) for s in plan.sizes]
    series = [Series("self-hosted", fleet, PALETTE[2])]
    if costs.hosted_monthly_usd is not None:
        ends = [(fleet[0][0], costs.hosted_monthly_usd), (fleet[-1][0], costs.hosted_monthly_usd)]
        series.append(Series("hosted", ends, PALETTE[4], dashed=True))
    y = Axis("$ per month", lambda v: f"${v:,.0f}")
    return line_chart("plan-cost", "Monthly cost by fleet size", series, _replica_axis(plan), y)


def turn_chart(plan: Plan) -> str:
    size = focus(plan)
    points = [(float(i), t.ttft_p50_s * 1000) for i, t in enumerate(size.turns, 1)]
    ticks = [(float(i), t.turn) for i, t in enumerate(size.turns, 1)]
    x = Axis("turn", lambda v: f"{v:.0f}", ticks=ticks)
    y = Axis("TTFT p50 (ms)", lambda v: f"{v:,.0f}")
    title = f"TTFT p50 by turn at {size.replicas} replica(s)"
    return line_chart("plan-turns", title, [Series("TTFT p50", points, PALETTE[0])], x, y)


def render_html(plan: Plan) -> str:
    body = [
        "<h1>kvmigrate plan</h1>",
        '<ul class="summary">',
        *(f"<li>{escape(line)}</li>" for line in summary_lines(plan)),
        "</ul>",
        '<h2>Charts</h2><div class="charts">',
        ttft_chart(plan),
        cost_chart(plan),
        turn_chart(plan),
        "</div>",
        *(html_table(t) for t in plan_tables(plan)),
        f'<p class="note">Costs: {escape(fmt.usd(plan.costs.gpu_hour_usd))} per GPU-hour, '
        "730 hours a month. A simulation: calibrate it (--calibrate) before trusting it.</p>",
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>kvmigrate plan</title>",
            f"<style>{STYLE}</style></head><body>",
            *body,
            f"<script>{SCRIPT}</script>",
            "</body></html>",
        ]
    )
