"""The GPU/KV and cost-per-token sections as tables, beside the proxy's own figures: each
missing figure says why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kvmigrate.report import fmt
from kvmigrate.report.cost_per_token import CostFigures
from kvmigrate.report.gpu import EngineFigures, Figure, GpuFigures
from kvmigrate.report.model import BackendSummary, Report
from kvmigrate.report.tables import Table

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


def gpu_table(report: Report, gpu: GpuFigures) -> Table:
    engines = gpu.engines
    common = _common_reason(gpu)
    band = f"{gpu.band_low_pct:g}-{gpu.band_high_pct:g}%"

    def cells(pick: Callable[[EngineFigures], Figure], show: Cell) -> tuple[str, ...]:
        return tuple(_cell(pick(e), show, common) for e in engines)

    utilisation = _cell(gpu.utilisation_pct, _percent, common)
    if gpu.utilisation_pct.shown:
        utilisation += f" ({gpu.band} the band)" if gpu.band != "within" else " (within the band)"
    width = max(len(engines), 1)
    rows: list[tuple[str, ...]] = [
        ("GPU utilisation, mean", band, utilisation, *[""] * (width - 1), ""),
        (
            "GPU utilisation, max",
            "",
            _cell(gpu.utilisation_max_pct, _percent, common),
            *[""] * (width - 1),
            "",
        ),
        ("KV cache in use, mean", "", *cells(lambda e: e.kv_usage_mean, fmt.pct), ""),
        ("KV cache in use, max", "", *cells(lambda e: e.kv_usage_max, fmt.pct), ""),
        ("requests running, mean", "", *cells(lambda e: e.running_mean, _count), ""),
        ("requests waiting, mean", "", *cells(lambda e: e.waiting_mean, _count), ""),
        ("requests waiting, max", "", *cells(lambda e: e.waiting_max, _count), ""),
        (
            "prefix cache hits (engine tokens; proxy: cached / prompt)",
            "",
            *cells(lambda e: e.prefix_hit_ratio, fmt.pct),
            _proxy(
                report,
                lambda b: b.cached_tokens / b.prompt_tokens if b.prompt_tokens else None,
                fmt.pct,
            ),
        ),
        ("prefix cache tokens looked up", "", *cells(lambda e: e.prefix_queries, fmt.number), ""),
        ("prefix cache tokens hit", "", *cells(lambda e: e.prefix_hits, fmt.number), ""),
        (
            "TTFT p50 (engine; proxy: recorded)",
            "",
            *cells(lambda e: e.ttft_p50_ms, fmt.ms),
            _proxy(report, lambda b: b.ttft_p50_ms, fmt.ms),
        ),
        (
            "TTFT p95 (engine; proxy: recorded)",
            "",
            *cells(lambda e: e.ttft_p95_ms, fmt.ms),
            _proxy(report, lambda b: b.ttft_p95_ms, fmt.ms),
        ),
        ("inter-token latency p50 (engine)", "", *cells(lambda e: e.itl_p50_ms, fmt.ms), ""),
        ("inter-token latency p95 (engine)", "", *cells(lambda e: e.itl_p95_ms, fmt.ms), ""),
        (
            "output tokens (engine; proxy: recorded)",
            "",
            *cells(lambda e: e.generation_tokens, fmt.number),
            _proxy(report, lambda b: float(b.completion_tokens), fmt.number),
        ),
        (
            "scrapes (failed) / replicas answering",
            "",
            *(f"{e.scrapes} ({e.failed_scrapes}) / {e.answering} of {e.replicas}" for e in engines),
            "",
        ),
    ]
    names = tuple(e.backend for e in engines) or ("candidate",)
    headers = ("figure", "target", *(f"{n} (engine)" for n in names), f"{report.candidate} (proxy)")
    return Table(
        "gpu",
        "GPU and KV use of the candidate, over the window",
        headers,
        rows,
        footnote=_gpu_footnote(gpu, common),
    )


def _proxy(report: Report, pick: Callable[[BackendSummary], float | None], show: Cell) -> str:
    summary = next((b for b in report.backends if b.backend == report.candidate), None)
    return show(pick(summary)) if summary is not None else fmt.MISSING


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
