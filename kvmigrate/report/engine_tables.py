"""The GPU/KV and cost-per-token sections as tables, beside the proxy's own figures: each
missing figure says why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kvmigrate.render import fmt
from kvmigrate.render.table import Table
from kvmigrate.report.cost_per_token import CostFigures
from kvmigrate.report.gpu import EngineFigures, Figure, GpuFigures
from kvmigrate.report.model import BackendSummary, Report

Cell = Callable[[float | None], str]


def engine_tables(report: Report) -> list[Table]:
    """Nothing when the report was built without the scrape setup (report.engine_use)."""
    tables = []
    if report.gpu is not None:
        tables.append(gpu_table(report, report.gpu))
    if report.cost_per_token is not None:
        tables.append(cost_per_token_table(report.cost_per_token))
    return tables


def _percent(value: float | None) -> str:
    return fmt.pct(value, ratio=False)


def _count(value: float | None) -> str:
    return fmt.number(value, 1)


# Each engine row: its label, the figure of each engine, how it shows, and the proxy's own
# figure beside it (None: the proxy has none).
EngineRow = tuple[
    str,
    Callable[[EngineFigures], Figure],
    Cell,
    Callable[[BackendSummary], float | None] | None,
]
ENGINE_ROWS: tuple[EngineRow, ...] = (
    ("KV cache in use, mean", lambda e: e.kv_usage_mean, fmt.pct, None),
    ("KV cache in use, max", lambda e: e.kv_usage_max, fmt.pct, None),
    ("requests running, mean", lambda e: e.running_mean, _count, None),
    ("requests waiting, mean", lambda e: e.waiting_mean, _count, None),
    ("requests waiting, max", lambda e: e.waiting_max, _count, None),
    (
        "prefix cache hits (engine tokens; proxy: cached / prompt)",
        lambda e: e.prefix_hit_ratio,
        fmt.pct,
        lambda b: b.cached_tokens / b.prompt_tokens if b.prompt_tokens else None,
    ),
    ("prefix cache tokens looked up", lambda e: e.prefix_queries, fmt.number, None),
    ("prefix cache tokens hit", lambda e: e.prefix_hits, fmt.number, None),
    (
        "TTFT p50 (engine; proxy: recorded)",
        lambda e: e.ttft_p50_ms,
        fmt.ms,
        lambda b: b.ttft_p50_ms,
    ),
    (
        "TTFT p95 (engine; proxy: recorded)",
        lambda e: e.ttft_p95_ms,
        fmt.ms,
        lambda b: b.ttft_p95_ms,
    ),
    ("inter-token latency p50 (engine)", lambda e: e.itl_p50_ms, fmt.ms, None),
    ("inter-token latency p95 (engine)", lambda e: e.itl_p95_ms, fmt.ms, None),
    (
        "output tokens (engine; proxy: recorded)",
        lambda e: e.generation_tokens,
        fmt.number,
        lambda b: float(b.completion_tokens),
    ),
)


def gpu_table(report: Report, gpu: GpuFigures) -> Table:
    engines = gpu.engines
    common = _common_reason(gpu)
    summary = next((b for b in report.backends if b.backend == report.candidate), None)
    rows = _utilisation_rows(gpu, common, max(len(engines), 1))
    for label, pick, show, proxy in ENGINE_ROWS:
        beside = "" if proxy is None else show(proxy(summary)) if summary else fmt.MISSING
        rows.append((label, "", *(_cell(pick(e), show, common) for e in engines), beside))
    rows.append(
        (
            "scrapes (failed) / replicas answering",
            "",
            *(f"{e.scrapes} ({e.failed_scrapes}) / {e.answering} of {e.replicas}" for e in engines),
            "",
        )
    )
    names = tuple(e.backend for e in engines) or ("candidate",)
    headers = ("figure", "target", *(f"{n} (engine)" for n in names), f"{report.candidate} (proxy)")
    title = "GPU and KV use of the candidate, over the window"
    return Table("gpu", title, headers, rows, footnote=_gpu_footnote(gpu, common))


def _utilisation_rows(gpu: GpuFigures, common: str, width: int) -> list[tuple[str, ...]]:
    """Utilisation is the GPUs', not one engine's: in the first engine column."""
    mean = _cell(gpu.utilisation_pct, _percent, common)
    if gpu.utilisation_pct.shown:
        mean += f" ({gpu.band} the band)"
    band = f"{gpu.band_low_pct:g}-{gpu.band_high_pct:g}%"
    most = _cell(gpu.utilisation_max_pct, _percent, common)
    pad = [""] * (width - 1)
    return [
        ("GPU utilisation, mean", band, mean, *pad, ""),
        ("GPU utilisation, max", "", most, *pad, ""),
    ]


def _cell(figure: Figure, show: Cell, common: str) -> str:
    if figure.shown:
        return show(figure.value)
    if figure.reason == common:
        return fmt.MISSING
    return f"{fmt.MISSING} ({figure.reason})"


def _common_reason(gpu: GpuFigures) -> str:
    """The reason most missing figures share, said once under the table."""
    reasons = Counter(
        f.reason
        for e in gpu.engines
        for f in (e.kv_usage_mean, e.prefix_hit_ratio, e.ttft_p50_ms, e.running_mean)
        if not f.shown
    )
    reasons.update([gpu.utilisation_pct.reason] if not gpu.utilisation_pct.shown else [])
    return reasons.most_common(1)[0][0] if reasons else ""


def _gpu_footnote(gpu: GpuFigures, common: str) -> str:
    parts = []
    if common:
        parts.append(f"Missing ({fmt.MISSING}): {common}.")
    for e in gpu.engines:
        parts += [
            f"{e.backend} replica {url}: its last scrape failed: {why}." for url, why in e.failing
        ]
    parts.append(
        f"The playbook's target is GPU utilisation within {gpu.band_low_pct:g}-"
        f"{gpu.band_high_pct:g}% while traffic moves. KV cache and prefix figures are the "
        "engine's own (vLLM /metrics) over the window; the proxy's column is what its records say."
    )
    return " ".join(parts)


def cost_per_token_table(cost: CostFigures) -> Table:
    rows = [
        (
            a.arm,
            a.backend,
            fmt.number(a.requests),
            f"{fmt.number(a.input_tokens)} / {fmt.number(a.output_tokens)}",
            fmt.usd(a.hosted_usd_per_m),
            fmt.usd(a.self_hosted_usd_per_m) if a.arm == "candidate" else "",
            fmt.usd(a.hosted_usd),
            fmt.usd(a.self_hosted_usd) if a.arm == "candidate" else "",
        )
        for a in cost.arms
    ]
    headers = (
        "arm",
        "backend",
        "answered",
        "tokens in / out",
        "hosted $ / 1M tokens",
        "self-hosted $ / 1M tokens",
        "hosted $ (window)",
        "self-hosted $ (window)",
    )
    return Table(
        "cost_per_token",
        "Cost per token, by arm, over the window",
        headers,
        rows,
        note="No answered calls in this window.",
        footnote=_cost_footnote(cost),
    )


def _cost_footnote(cost: CostFigures) -> str:
    plural = "" if cost.gpus == 1 else "s"
    gpus = f"{fmt.number(cost.gpus)} GPU{plural} ({cost.gpus_source})"
    if cost.reason:
        return f"Self-hosted cost not computed: {cost.reason}. {gpus}."
    hours = f"{fmt.number(cost.gpu_hours, 2)} GPU-hours ({cost.hours_source})"
    parts = [f"{gpus} x {fmt.number(cost.hours, 2)} h = {hours} at {fmt.usd(cost.gpu_hour_price)}."]
    if cost.break_even_load is not None:
        parts.append(
            f"Break-even: the candidate costs what the hosted API would at "
            f"{fmt.number(cost.break_even_load, 2)}x its load in this window "
            f"({fmt.number(cost.break_even_tokens_per_gpu_s, 1)} tokens/s per GPU)"
        )
        if cost.break_even_utilisation_pct is not None:
            parts[-1] += (
                f", a GPU utilisation of {_percent(cost.break_even_utilisation_pct)} "
                f"(measured: {_percent(cost.utilisation_pct)})"
            )
            if cost.break_even_utilisation_pct > 100.0:
                parts[-1] += ": past full use, so not reachable at these prices"
        else:
            parts[-1] += "; GPU utilisation not measured, so no break-even utilisation"
        parts[-1] += "."
    return " ".join(parts)
