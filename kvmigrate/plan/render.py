"""A plan as text (the tables) or JSON (every figure, in seconds and ratios)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from kvmigrate.plan.sweep import Plan
from kvmigrate.plan.tables import plan_tables, summary_lines
from kvmigrate.report.render_text import text_table

TITLE = "kvmigrate plan"


def render_text(plan: Plan) -> str:
    out = [TITLE, "=" * len(TITLE), *summary_lines(plan), ""]
    for table in plan_tables(plan):
        out += [table.title, "-" * len(table.title), *text_table(table), ""]
    return "\n".join(out)


def _finite(value: Any) -> Any:
    """JSON has no Infinity: a TTFT no request reached (all refused) is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


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
        "sizes": [
            _finite({**asdict(s), "monthly_usd": costs.monthly_usd(s.replicas)}) for s in plan.sizes
        ],
        "headroom": plan.headroom,
        "chosen": None
        if chosen is None or buy is None
        else {
            "replicas": chosen.replicas,
            "monthly_usd": costs.monthly_usd(chosen.replicas),
            "utilisation": chosen.utilisation,
            "buy_replicas": buy,
            "buy_gpus": buy * costs.gpus_per_replica,
            "buy_monthly_usd": costs.monthly_usd(buy),
        },
        "notes": list(plan.notes),
    }
