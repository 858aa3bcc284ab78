"""GPU and KV use of the candidates over the report's window, from the stored scrapes
(kvmigrate.engine): each figure with its value, or the reason it has none."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvmigrate.config import Config
from kvmigrate.engine.samples import ScrapeResult
from kvmigrate.engine.targets import vllm_targets
from kvmigrate.engine.vllm_sample import COUNTERS, GAUGES, HISTOGRAMS, Histogram
from kvmigrate.engine.window import histogram_increase, increase, merge, quantile
from kvmigrate.render import fmt
from kvmigrate.report.gpu_series import UseSeries, use_series

# The playbook's target for GPU utilisation while traffic moves: busy enough to pay for
# itself, with headroom for bursts.
BAND_LOW_PCT = 70.0
BAND_HIGH_PCT = 80.0

SCRAPE_OFF = "not configured: gpu.scrape is off"
NO_GPU_SOURCE = "not configured: set gpu.dcgm_urls or gpu.prometheus_url"
CPU_BUILD = "a CPU build of vLLM (gpu.device: cpu) has no GPU to measure"
NO_SAMPLES = "no scrape in this window (no proxy with gpu.scrape on ran in it)"
ONE_SAMPLE = "one scrape in this window: a running total needs two"


@dataclass(frozen=True, slots=True)
class Figure:
    """A figure over the window, or None with the reason."""

    value: float | None = None
    reason: str = ""

    @property
    def shown(self) -> bool:
        return self.value is not None


@dataclass(frozen=True, slots=True)
class EngineFigures:
    """One candidate backend's vLLM engines (all its replicas) over the window."""

    backend: str
    replicas: int  # scraped
    answering: int  # of them, with at least one readable scrape in the window
    scrapes: int
    failed_scrapes: int
    kv_usage_mean: Figure  # fractions of the KV cache in use, 0..1
    kv_usage_max: Figure
    running_mean: Figure
    waiting_mean: Figure
    waiting_max: Figure
    prefix_queries: Figure  # tokens looked up in the prefix cache over the window
    prefix_hits: Figure
    prefix_hit_ratio: Figure
    generation_tokens: Figure
    ttft_p50_ms: Figure  # the engine's own, from its histogram over the window
    ttft_p95_ms: Figure
    itl_p50_ms: Figure
    itl_p95_ms: Figure
    last_error: str = ""  # the newest failed scrape's reason
    last_error_at: float | None = None
    # (replica URL, reason) of each replica whose last scrape in the window failed
    failing: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GpuFigures:
    engines: tuple[EngineFigures, ...] = ()
    utilisation_pct: Figure = Figure(None, SCRAPE_OFF)  # mean over the window, 0..100
    utilisation_max_pct: Figure = Figure(None, SCRAPE_OFF)
    band_low_pct: float = BAND_LOW_PCT
    band_high_pct: float = BAND_HIGH_PCT
    band: str = "not measured"  # below / within / above the band, or not measured
    gpus_seen: int | None = None  # the most GPUs one scrape of the GPU source listed
    source: str = ""  # dcgm, prometheus, or "" (none configured)
    series: tuple[UseSeries, ...] = ()  # utilisation and KV use over time, in percent


@dataclass(frozen=True, slots=True)
class ScrapeSetup:
    """What the config asks to scrape: each candidate's replica count, the GPU source."""

    scrape: bool
    device: str
    replicas: dict[str, int]
    gpu_source: str
    gpus: int = 0  # gpu.gpus: the GPUs serving the candidate, for cost (0: counted)
    gpus_per_replica: int = 1

    @classmethod
    def of(cls, config: Config) -> ScrapeSetup:
        counts: dict[str, int] = defaultdict(int)
        for target in vllm_targets(config):
            counts[target.backend] += 1
        gpu = config.gpu
        source = "prometheus" if gpu.prometheus_url else "dcgm" if gpu.dcgm_urls else ""
        return cls(gpu.scrape, gpu.device, dict(counts), source, gpu.gpus, gpu.gpus_per_replica)


def gpu_figures(results: Sequence[ScrapeResult], setup: ScrapeSetup) -> GpuFigures:
    """The figures of the scrapes stored in the window (in time order)."""
    engines = tuple(
        engine_figures(name, replicas, _of(results, name), setup.scrape)
        for name, replicas in setup.replicas.items()
    )
    gpu = [r for r in results if r.kind in ("dcgm", "prometheus")]
    figures = GpuFigures(engines=engines, source=setup.gpu_source, series=use_series(results))
    return _with_utilisation(figures, gpu, setup)


def _of(results: Sequence[ScrapeResult], backend: str) -> list[ScrapeResult]:
    return [r for r in results if r.kind == "vllm" and r.backend == backend]


def engine_figures(
    backend: str, replicas: int, results: Sequence[ScrapeResult], scrape: bool
) -> EngineFigures:
    """One candidate's figures from its replicas' scrapes in the window (in time order)."""
    w = _EngineWindow(results, scrape)
    queries, hits = w.counter("prefix_queries"), w.counter("prefix_hits")
    last = w.failed[-1] if w.failed else None
    return EngineFigures(
        backend=backend,
        replicas=replicas,
        answering=len(w.by_target),
        scrapes=len(results),
        failed_scrapes=len(w.failed),
        kv_usage_mean=w.gauge("kv_usage", max_of=False),
        kv_usage_max=w.gauge("kv_usage", max_of=True),
        running_mean=w.gauge("running", max_of=False),
        waiting_mean=w.gauge("waiting", max_of=False),
        waiting_max=w.gauge("waiting", max_of=True),
        prefix_queries=queries,
        prefix_hits=hits,
        prefix_hit_ratio=_ratio(hits, queries),
        generation_tokens=w.counter("generation_tokens"),
        ttft_p50_ms=w.latency("ttft", 0.5),
        ttft_p95_ms=w.latency("ttft", 0.95),
        itl_p50_ms=w.latency("itl", 0.5),
        itl_p95_ms=w.latency("itl", 0.95),
        last_error=(last.error or "") if last else "",
        last_error_at=last.ts if last else None,
        failing=_failing(results),
    )


class _EngineWindow:
    """One candidate's scrapes in the window: gauges over every readable scrape, running
    totals and histograms replica by replica (each engine counts its own).

    A replica's totals are read scraper by scraper. Every proxy replica scrapes each engine
    and stamps a scrape with the time it began, so in time order two scrapers' reads can
    cross: one whose answer came late holds a higher total than the next one stamped, which
    would read as a restart and count the engine's whole total again. Each scraper's own
    series is in order; a replica's growth is the most any of its scrapers saw."""

    def __init__(self, results: Sequence[ScrapeResult], scrape: bool) -> None:
        self.ok = [r for r in results if r.engine is not None]
        self.failed = [r for r in results if r.error is not None]
        self.reason = _missing_reason(scrape, results, self.ok, self.failed)
        self.by_target: dict[str, dict[str, list[ScrapeResult]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for r in self.ok:
            self.by_target[r.target][r.source].append(r)

    def gauge(self, figure: str, max_of: bool) -> Figure:
        known = [v for r in self.ok if (v := getattr(r.engine, figure)) is not None]
        if self.reason or not known:
            return Figure(None, self.reason or _absent(figure, self.ok))
        return Figure(max(known) if max_of else sum(known) / len(known))

    def counter(self, figure: str) -> Figure:
        if self.reason:
            return Figure(None, self.reason)
        grown = [_most_grown(figure, by_source) for by_source in self.by_target.values()]
        known = [g for g in grown if g is not None]
        if known:
            return Figure(sum(known))
        absent = _absent(figure, self.ok)
        return Figure(None, absent if absent != _UNKNOWN else ONE_SAMPLE)

    def latency(self, figure: str, q: float) -> Figure:
        """The engine's own latency percentile over the window, in ms."""
        if self.reason:
            return Figure(None, self.reason)
        grown = [_most_observed(figure, by_source) for by_source in self.by_target.values()]
        merged = merge([g for g in grown if g is not None])
        value = quantile(merged, q)
        if value is not None:
            return Figure(value * 1000.0)
        absent = _absent(figure, self.ok)
        if absent == _UNKNOWN:
            absent = ONE_SAMPLE if merged is None else "no request finished in this window"
        return Figure(None, absent)


def _most_grown(figure: str, by_source: dict[str, list[ScrapeResult]]) -> float | None:
    """One replica's running total's growth over the window, from the scraper that saw most."""
    grown = [increase([getattr(r.engine, figure) for r in rs]) for rs in by_source.values()]
    return max((g for g in grown if g is not None), default=None)


def _most_observed(figure: str, by_source: dict[str, list[ScrapeResult]]) -> Histogram | None:
    """One replica's histogram growth over the window, from the scraper that saw the most."""
    grown = [
        g
        for rs in by_source.values()
        if (g := histogram_increase([getattr(r.engine, figure) for r in rs])) is not None
    ]
    return max(grown, key=lambda h: h.count, default=None)


def _ratio(hits: Figure, queries: Figure) -> Figure:
    if hits.value is None or queries.value is None:
        return Figure(None, queries.reason or hits.reason)
    if queries.value <= 0:
        return Figure(None, "no prompt tokens looked up in this window")
    return Figure(hits.value / queries.value)


def _failing(results: Sequence[ScrapeResult]) -> tuple[tuple[str, str], ...]:
    last: dict[str, ScrapeResult] = {}
    for r in results:
        last[r.target] = r
    return tuple((t, r.error) for t, r in last.items() if r.error is not None)


_UNKNOWN = "no value in this window"
_NAMES = {**GAUGES, **COUNTERS, **HISTOGRAMS}


def _absent(figure: str, ok: Sequence[ScrapeResult]) -> str:
    """Why a figure has no value though scrapes were read: this vLLM does not export it."""
    if ok and all(r.engine is not None and figure in r.engine.absent for r in ok):
        names = " or ".join(_NAMES[figure])
        return f"not exported by this vLLM version (no {names})"
    return _UNKNOWN


def _missing_reason(
    scrape: bool,
    results: Sequence[ScrapeResult],
    ok: Sequence[ScrapeResult],
    failed: Sequence[ScrapeResult],
) -> str:
    """Why none of a source's figures has a value; "" when some may."""
    if not scrape:
        return SCRAPE_OFF
    if not results:
        return NO_SAMPLES
    if not ok:
        last = failed[-1]
        return f"scrape failing since {fmt.when(failed[0].ts)}: {last.error} ({last.target})"
    return ""


def _with_utilisation(
    figures: GpuFigures, results: Sequence[ScrapeResult], setup: ScrapeSetup
) -> GpuFigures:
    ok = [r for r in results if r.gpu is not None]
    failed = [r for r in results if r.error is not None]
    if not setup.gpu_source:
        reason = CPU_BUILD if setup.device == "cpu" else NO_GPU_SOURCE
        reason = reason if setup.scrape else SCRAPE_OFF
    else:
        reason = _missing_reason(setup.scrape, results, ok, failed)
    if reason:
        missing = Figure(None, reason)
        return replace(figures, utilisation_pct=missing, utilisation_max_pct=missing)
    weights = [(r.gpu.util_pct, r.gpu.gpus or 1) for r in ok if r.gpu is not None]
    mean = sum(u * w for u, w in weights) / sum(w for _, w in weights)
    per_round: dict[float, int] = defaultdict(int)
    for r in ok:
        if r.gpu is not None and r.gpu.gpus is not None:
            per_round[r.ts] += r.gpu.gpus
    return replace(
        figures,
        utilisation_pct=Figure(mean),
        utilisation_max_pct=Figure(max(u for u, _ in weights)),
        band=band_of(mean),
        gpus_seen=max(per_round.values()) if per_round else None,
    )


def band_of(utilisation_pct: float | None) -> str:
    """Where a utilisation stands against the playbook's 70-80% band."""
    if utilisation_pct is None:
        return "not measured"
    if utilisation_pct < BAND_LOW_PCT:
        return "below"
    return "above" if utilisation_pct > BAND_HIGH_PCT else "within"
