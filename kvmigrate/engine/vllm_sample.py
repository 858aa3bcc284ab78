"""One scrape of a vLLM server's /metrics, reduced to the figures the report shows.

vLLM renamed some of them between versions; each figure lists its names, newest first:
the KV-cache gauge was `vllm:gpu_cache_usage_perc` before the V1 engine's
`vllm:kv_cache_usage_perc` (both a fraction, 1 = full), the prefix-cache counters were
`vllm:gpu_prefix_cache_*`, and the inter-token latency histogram was
`vllm:time_per_output_token_seconds`. A figure none of whose names is exported is listed in
`absent`, so the report can say that this vLLM version does not have it, rather than
showing an empty cell with no reason.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kvmigrate.engine.prom_text import Parsed, parse

# The figure, and the names vLLM exported it under (newest first).
GAUGES: dict[str, tuple[str, ...]] = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
}
# Averaged over the engines of a data-parallel server; every other figure is summed.
MEAN_OVER_ENGINES = frozenset({"kv_usage"})
# The values a figure can take: a series outside them (a broken or hostile exporter's
# 1e308) is no reading, as a non-finite one is, rather than a mean that overflows.
SHARE = (0.0, 1.0)
COUNT = (0.0, 1e15)
RANGES = {"kv_usage": SHARE}
FIGURES = (*GAUGES, *COUNTERS, *HISTOGRAMS)
PREFIXES = tuple(n for names in (*GAUGES.values(), *COUNTERS.values()) for n in names) + tuple(
    n for names in HISTOGRAMS.values() for n in names
)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts (upper bound, count), the last bound +Inf; summed over the
    server's engines and models."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class EngineSample:
    kv_usage: float | None = None  # fraction of the KV cache in use, 0..1
    running: float | None = None
    waiting: float | None = None
    prefix_queries: float | None = None  # counters, in tokens, since the engine started
    prefix_hits: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    absent: tuple[str, ...] = ()  # figures none of whose names the server exports
    bad_lines: int = 0  # lines of the figures' metrics that could not be read

    @property
    def empty(self) -> bool:
        """No vLLM figure at all: not a vLLM server's /metrics, or an unreadable one."""
        return len(self.absent) == len(FIGURES)


def read_vllm(text: str) -> EngineSample:
    parsed = parse(text, PREFIXES)
    values: dict[str, float | None] = {}
    absent: list[str] = []
    for figure, names in (*GAUGES.items(), *COUNTERS.items()):
        span = RANGES.get(figure, COUNT)
        values[figure] = _scalar(parsed, names, figure in MEAN_OVER_ENGINES, span)
        if values[figure] is None:
            absent.append(figure)
    ttft = _histogram(parsed, HISTOGRAMS["ttft"])
    itl = _histogram(parsed, HISTOGRAMS["itl"])
    absent += [name for name, h in (("ttft", ttft), ("itl", itl)) if h is None]
    return EngineSample(
        **values,
        ttft=ttft,
        itl=itl,
        absent=tuple(absent),
        bad_lines=parsed.bad_lines,
    )


def _scalar(
    parsed: Parsed, names: tuple[str, ...], mean: bool, span: tuple[float, float]
) -> float | None:
    low, high = span
    for name in names:
        found = [s.value for s in parsed.named(name) if low <= s.value <= high]
        if found:
            return sum(found) / len(found) if mean else sum(found)
    return None


def _histogram(parsed: Parsed, names: tuple[str, ...]) -> Histogram | None:
    for name in names:
        buckets: dict[float, float] = defaultdict(float)
        for series in parsed.named(f"{name}_bucket"):
            try:
                bound = float(series.labels.get("le", ""))
            except ValueError:
                continue
            buckets[bound] += series.value
        if not buckets:
            continue
        total = sum(s.value for s in parsed.named(f"{name}_sum"))
        count = sum(s.value for s in parsed.named(f"{name}_count"))
        return Histogram(tuple(sorted(buckets.items())), total, count)
    return None
