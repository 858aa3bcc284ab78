"""A plan as text (the tables) or JSON (every figure, in seconds and ratios)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from kvmigrate.plan.metrics import FleetFigures
from kvmigrate.plan.sweep import Plan
from kvmigrate.plan.tables import focus, plan_tables, summary_lines
from kvmigrate.render import fmt
from kvmigrate.render.json_values import finite
from kvmigrate.render.table import text_table

TITLE = "kvmigrate plan"


def render_text(plan: Plan) -> str:
    out = [TITLE, "=" * len(TITLE), *summary_lines(plan), ""]
    for table in plan_tables(plan):
        out += [table.title, "-" * len(table.title), *text_table(table), ""]
    return "\n".join(out)


def plan_json(plan: Plan) -> dict[str, Any]:
    w, f, costs = plan.workload, plan.fleet, plan.costs
    chosen, buy = plan.chosen, plan.buy
    return {
        "workload": {
            "source": w.source,
            "requests": len(w.requests),
            "conversations": w.conversations,
            "basis_s": w.basis_s,
            "skipped": w.skipped,
            "window": _window(plan),
        },
        "fleet": {
            "kv_blocks": f.kv_blocks,
            "block_size": f.engine.block_size,
            "max_batched_tokens": f.engine.max_batched_tokens,
            "max_seqs": f.engine.max_seqs,
            "routing": f.routing,
            "prefix_caching": f.prefix_caching,
            "gpus_per_replica": costs.gpus_per_replica,
        },
        "cost_model": f.cost.to_json(),
        "ttft_p95_slo_s": plan.slo_p95_s,
        "gpu_hour_usd": costs.gpu_hour_usd,
        "hosted_monthly_usd": costs.hosted_monthly_usd,
        "sizes": [_size(plan, s) for s in plan.sizes],
        "headroom": plan.headroom,
        "chosen": None
        if chosen is None or buy is None
        else {
            "replicas": chosen.replicas,
            "monthly_usd": costs.monthly_usd(chosen.replicas),
            **_utilisation(chosen),
            "buy_replicas": buy,
            "buy_gpus": buy * costs.gpus_per_replica,
            "buy_monthly_usd": costs.monthly_usd(buy),
        },
        "turn_slo": _turn_slo(plan),
        "n_plus_one": None if plan.spare is None else finite(asdict(plan.spare)),
        "notes": list(plan.notes),
    }


def _window(plan: Plan) -> dict[str, Any] | None:
    """The recording replayed, in epoch seconds and as UTC times (None: a dataset)."""
    window = plan.workload.window
    if window is None:
        return None
    first, last = window
    return {
        "first_ts": first,
        "last_ts": last,
        "first": fmt.when(first),
        "last": fmt.when(last),
        "duration_s": last - first,
    }


def _size(plan: Plan, size: FleetFigures) -> dict[str, Any]:
    """A fleet size's figures, each turn marked with whether it met the SLO."""
    data = asdict(size)
    for turn in data["turns"]:
        turn["meets_slo"] = plan.meets(turn["ttft_p95_s"])
    shown: dict[str, Any] = finite({**data, "monthly_usd": plan.costs.monthly_usd(size.replicas)})
    return shown


def _utilisation(size: FleetFigures) -> dict[str, Any]:
    return {
        "utilisation": size.utilisation,
        "binding": "kv_cache" if size.kv_held >= size.compute else "compute",
        "compute": size.compute,
        "kv_held": size.kv_held,
        "any_step_running": size.any_step_running,
    }


def _turn_slo(plan: Plan) -> dict[str, Any] | None:
    """Per-turn SLO status at the chosen fleet (else the largest): a fleet can meet the SLO
    overall while its long late turns miss it (None: no SLO given)."""
    if plan.slo_p95_s is None:
        return None
    size = focus(plan)
    turns = [
        {"turn": t.turn, "requests": t.requests, "ttft_p95_s": t.ttft_p95_s,
         "meets_slo": plan.meets(t.ttft_p95_s)}
        for t in size.turns
    ]  # fmt: skip
    failing = [t["turn"] for t in turns if not t["meets_slo"]]
    shown: dict[str, Any] = finite({"replicas": size.replicas, "turns": turns, "failing": failing})
    return shown
