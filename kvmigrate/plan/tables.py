"""A plan's sections as tables of formatted cells, shared by the text and HTML views."""

from __future__ import annotations

from kvmigrate.plan.metrics import FleetFigures
from kvmigrate.plan.sweep import Plan
from kvmigrate.report import fmt
from kvmigrate.report.tables import Table


def _ms(seconds: float) -> str:
    return fmt.ms(seconds * 1000.0)


def summary_lines(plan: Plan) -> list[str]:
    w, f, c = plan.workload, plan.fleet, plan.fleet.cost
    span = fmt.duration(w.basis_s) if w.basis_s > 0 else "no recorded time"
    lines = [
        f"Workload: {len(w.requests):,} requests in {w.conversations:,} conversations over "
        f"{span} ({w.source})"
        + (f"; {w.skipped:,} records without token counts skipped" if w.skipped else ""),
        f"Fleet: {f.kv_blocks:,} KV blocks of {f.engine.block_size} tokens per replica "
        f"({f.kv_blocks * f.engine.block_size:,} tokens); routing {f.routing}; prefix caching "
        f"{'on' if f.prefix_caching else 'off'}; token budget {f.engine.max_batched_tokens:,}"
        f"/step, {f.engine.max_seqs} sequences",
        f"Cost model ({c.source}): {_ms(c.overhead_s)}/step + "
        f"{1 / c.prefill_token_s if c.prefill_token_s else float('inf'):,.0f} prefill tokens/s"
        f" + {c.cached_token_s * 1e6:.2f} µs per cached token + "
        f"{c.attention_s * 1e9:.3g} ns per attended token pair + "
        f"{c.decode_seq_s * 1e3:.2f} ms per decoding sequence; {_ms(c.request_s)} per request",
    ]
    return lines + list(plan.notes) + [verdict(plan)]


def verdict(plan: Plan) -> str:
    costs = plan.costs
    hosted = (
        f" against {fmt.usd(costs.hosted_monthly_usd)}/month hosted"
        if (costs.hosted_monthly_usd is not None)
        else ""
    )
    if plan.slo_p95_s is None:
        return "No --ttft-p95-slo given: no fleet size chosen."
    chosen = plan.chosen
    if chosen is None:
        largest = plan.sizes[-1].replicas
        return f"No fleet up to {largest} replicas meets TTFT p95 <= {_ms(plan.slo_p95_s)}."
    gpus = chosen.replicas * costs.gpus_per_replica
    return (
        f"Smallest fleet meeting TTFT p95 <= {_ms(plan.slo_p95_s)}: {chosen.replicas} "
        f"replica(s), {gpus} GPU(s), {fmt.usd(costs.monthly_usd(chosen.replicas))}/month{hosted}."
    )


def sweep_table(plan: Plan) -> Table:
    rows = []
    for s in plan.sizes:
        meets = (
            "" if plan.slo_p95_s is None else ("yes" if s.ttft_p95_s <= plan.slo_p95_s else "no")
        )
        rows.append(
            (
                str(s.replicas),
                fmt.pct(s.hit_rate),
                _ms(s.ttft_p50_s),
                _ms(s.ttft_p95_s),
                _ms(s.queue_p95_s),
                fmt.pct(s.busy),
                meets,
                fmt.usd(plan.costs.monthly_usd(s.replicas)),
            )
        )
    headers = (
        "replicas",
        "cache hit",
        "TTFT p50",
        "TTFT p95",
        "queue p95",
        "busy",
        "meets SLO",
        "$/month",
    )
    return Table("sweep", "Fleet sizes", headers, rows)


def focus(plan: Plan) -> FleetFigures:
    """The fleet size the per-turn table shows: the chosen one, else the largest."""
    return plan.chosen or plan.sizes[-1]


def turn_table(plan: Plan) -> Table:
    size = focus(plan)
    rows = [
        (t.turn, f"{t.requests:,}", _ms(t.ttft_p50_s), _ms(t.ttft_p95_s), fmt.pct(t.hit_rate))
        for t in size.turns
    ]
    title = f"TTFT by turn at {size.replicas} replica(s)"
    return Table("turns", title, ("turn", "requests", "TTFT p50", "TTFT p95", "cache hit"), rows)


def plan_tables(plan: Plan) -> list[Table]:
    return [sweep_table(plan), turn_table(plan)]
