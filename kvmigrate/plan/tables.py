"""A plan's sections as tables of formatted cells, shared by the text and HTML views."""

from __future__ import annotations

from kvmigrate.plan.metrics import FleetFigures
from kvmigrate.plan.sweep import UTILISATION_BAND, Plan
from kvmigrate.render import fmt
from kvmigrate.render.table import Table


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
    lines.insert(1, window_line(plan))
    refused = refused_line(plan)
    spare = spare_line(plan)
    return (
        lines
        + list(plan.notes)
        + ([refused] if refused else [])
        + [verdict(plan)]
        + ([spare] if spare else [])
    )


def window_line(plan: Plan) -> str:
    """The recording replayed, so a plan sized on a quiet day is seen to be."""
    window = plan.workload.window
    if window is None:
        return "Recording window: none (a dataset has no times; it was paced)"
    first, last = window
    return (
        f"Recording window: {fmt.when(first)} to {fmt.when(last)} "
        f"({fmt.duration(last - first)}), first request to last answer"
    )


def spare_line(plan: Plan) -> str | None:
    """N+1: the bought fleet with one replica lost (None: nothing bought)."""
    spare = plan.spare
    if spare is None or plan.slo_p95_s is None:
        return None
    if spare.left < 1:
        seen = "no replica left to serve"
    elif spare.ttft_p95_s is None:
        seen = f"not simulated; the SLO's fleet is {plan.chosen.replicas if plan.chosen else '?'}"
    else:
        seen = f"TTFT p95 {_ms(spare.ttft_p95_s)}"
    holds = "holds" if spare.holds else "does NOT hold"
    return (
        f"N+1 {holds}: {spare.fleet} replica(s) less one is {spare.left} ({seen}) against "
        f"TTFT p95 <= {_ms(plan.slo_p95_s)}"
        + ("" if spare.holds else "; raise --headroom to survive a lost replica")
        + "."
    )


def refused_line(plan: Plan) -> str | None:
    """A warning when requests were larger than a replica's whole KV cache."""
    refused = max((s.refused for s in plan.sizes), default=0)
    if not refused:
        return None
    f = plan.fleet
    total = plan.sizes[0].requests
    return (
        f"WARNING: {refused:,} of {total:,} requests ({refused / total:.1%}) need more KV cache "
        f"than one replica holds ({f.kv_blocks * f.engine.block_size:,} tokens): vLLM refuses "
        "them (longer than its max_model_len), so they are left out of the TTFT and hit-rate "
        "figures. Use a GPU with more memory or more --gpus-per-replica."
    )


def band_words(utilisation: float) -> str:
    low, high = UTILISATION_BAND
    if utilisation < low:
        where = "below"
    elif utilisation > high:
        where = "above"
    else:
        where = "within"
    return f"{fmt.pct(utilisation)} utilisation, {where} the {low:.0%}-{high:.0%} band"


def utilisation_words(size: FleetFigures) -> str:
    binding = "KV cache" if size.kv_held >= size.compute else "compute"
    return f"{band_words(size.utilisation)} ({binding} is the binding resource)"


def verdict(plan: Plan) -> str:
    costs = plan.costs
    hosted = (
        f" against {fmt.usd(costs.hosted_monthly_usd)}/month hosted"
        if (costs.hosted_monthly_usd is not None)
        else ""
    )
    if plan.slo_p95_s is None:
        return "No --ttft-p95-slo given: no fleet size chosen."
    chosen, buy = plan.chosen, plan.buy
    if chosen is None or buy is None:
        largest = plan.sizes[-1].replicas
        return f"No fleet up to {largest} replicas meets TTFT p95 <= {_ms(plan.slo_p95_s)}."
    bought = next((s for s in plan.sizes if s.replicas == buy), None)
    at_buy = f" (at {buy}: {band_words(bought.utilisation)})" if bought is not None else ""
    return (
        f"Smallest fleet meeting TTFT p95 <= {_ms(plan.slo_p95_s)}: {chosen.replicas} "
        f"replica(s), at {utilisation_words(chosen)}. Buy {buy} replica(s) "
        f"({chosen.replicas} + {plan.headroom:.0%} headroom, rounded up){at_buy}: "
        f"{buy * costs.gpus_per_replica} GPU(s), {fmt.usd(costs.monthly_usd(buy))}/month{hosted}."
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
                fmt.pct(s.any_step_running),
                fmt.pct(s.compute),
                fmt.pct(s.kv_held),
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
        "any step running",
        "compute used",
        "KV held",
        "meets SLO",
        "$/month",
    )
    return Table("sweep", "Fleet sizes", headers, rows)


def focus(plan: Plan) -> FleetFigures:
    """The fleet size the per-turn table shows: the chosen one, else the largest."""
    return plan.chosen or plan.sizes[-1]


def turn_table(plan: Plan) -> Table:
    size = focus(plan)
    words = {None: "", True: "yes", False: "no"}
    rows = [
        (
            t.turn,
            f"{t.requests:,}",
            _ms(t.ttft_p50_s),
            _ms(t.ttft_p95_s),
            words[plan.meets(t.ttft_p95_s)],
            fmt.pct(t.hit_rate),
        )
        for t in size.turns
    ]
    title = f"TTFT by turn at {size.replicas} replica(s)"
    headers = ("turn", "requests", "TTFT p50", "TTFT p95", "meets SLO", "cache hit")
    return Table("turns", title, headers, rows)


def plan_tables(plan: Plan) -> list[Table]:
    return [sweep_table(plan), turn_table(plan)]
