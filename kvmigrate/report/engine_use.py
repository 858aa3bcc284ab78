"""The report's GPU, KV and cost-per-token figures, from the stored scrapes and the
window's records: what `build_report` adds when it is given the config's scrape setup."""

from __future__ import annotations

from collections.abc import Sequence

from kvmigrate.engine import samples
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report.cost_per_token import CostFigures, cost_per_token, gpu_count, hours_running
from kvmigrate.report.gpu import GpuFigures, ScrapeSetup, gpu_figures
from kvmigrate.report.model import Prices
from kvmigrate.report.rows import Row


def engine_use(
    store: RecordStore | None,
    rows: Sequence[Row],
    since: float,
    until: float,
    primary: str,
    candidate: str,
    prices: Prices,
    setup: ScrapeSetup,
) -> tuple[GpuFigures, CostFigures]:
    """`rows`: the window's records in time order, noise calls left out."""
    results = samples.read(store, since, until) if store is not None else []
    gpu = gpu_figures(results, setup)
    engine = next((e for e in gpu.engines if e.backend == candidate), None)
    own = [r for r in results if r.kind == "vllm" and r.backend == candidate and r.engine]
    span = own[-1].ts - own[0].ts if len(own) > 1 else None
    count = gpu_count(
        setup.gpus,
        gpu.gpus_seen,
        engine.answering if engine else 0,
        setup.gpus_per_replica,
        setup.replicas.get(candidate, 0),
    )
    answered = [r for r in rows if r.backend == candidate]
    cost = cost_per_token(
        rows,
        primary,
        candidate,
        prices,
        count,
        hours_running(span, answered),
        gpu.utilisation_pct.value,
    )
    return gpu, cost
