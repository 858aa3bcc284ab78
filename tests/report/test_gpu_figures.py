"""GPU and KV figures over a window from stored scrapes: each figure's value, or the reason
it has none (not configured, scrape failing with its last error, absent in this vLLM
version, a CPU build), and where utilisation stands against the 70-80% band."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kvmigrate.engine.gpu_util import GpuSample
from kvmigrate.engine.samples import ScrapeResult
from kvmigrate.engine.vllm_sample import EngineSample, Histogram
from kvmigrate.report.gpu import (
    CPU_BUILD,
    NO_GPU_SOURCE,
    NO_SAMPLES,
    ONE_SAMPLE,
    SCRAPE_OFF,
    Figure,
    ScrapeSetup,
    band_of,
    gpu_figures,
)

URL = "http://vllm-0:8000/metrics"
TTFT = Histogram(((0.1, 0.0), (1.0, 0.0), (math.inf, 0.0)), 0.0, 0.0)


def engine(
    ts: float, kv: float | None, queries: float, hits: float, done: float = 0.0, **kw: object
) -> ScrapeResult:
    ttft = Histogram(((0.1, done / 2), (1.0, done), (math.inf, done)), done * 0.2, done)
    sample = EngineSample(
        kv_usage=kv,
        running=2.0,
        waiting=1.0,
        prefix_queries=queries,
        prefix_hits=hits,
        generation_tokens=queries / 10,
        ttft=ttft,
        itl=ttft,
        absent=() if kv is not None else ("kv_usage",),
        **kw,  # type: ignore[arg-type]
    )
    return ScrapeResult(ts, "vllm", "vllm", URL, engine=sample)


def failed(ts: float, error: str, url: str = URL) -> ScrapeResult:
    return ScrapeResult(ts, "vllm", "vllm", url, error=error)


def gpu(ts: float, util: float, gpus: int | None = 2) -> ScrapeResult:
    return ScrapeResult(ts, "dcgm", "", "http://dcgm:9400/metrics", gpu=GpuSample(util, gpus))


SETUP = ScrapeSetup(True, "gpu", {"vllm": 1}, "dcgm")


def test_a_window_of_readable_scrapes_gives_every_figure() -> None:
    results = [
        engine(0, 0.1, 1000, 400),
        gpu(0, 70),
        engine(15, 0.3, 1600, 700, done=10),
        gpu(15, 80),
    ]
    figures = gpu_figures(results, SETUP)
    (e,) = figures.engines
    assert (e.kv_usage_mean, e.kv_usage_max) == (Figure(0.2), Figure(0.3))
    assert (e.prefix_queries, e.prefix_hits) == (Figure(600.0), Figure(300.0))
    assert e.prefix_hit_ratio == Figure(0.5)
    assert e.generation_tokens == Figure(60.0)
    assert e.ttft_p50_ms == Figure(100.0)  # 5 of 10 under 0.1 s
    assert (e.answering, e.scrapes, e.failed_scrapes, e.failing) == (1, 2, 0, ())
    assert figures.utilisation_pct == Figure(75.0)
    assert figures.utilisation_max_pct == Figure(80.0)
    assert figures.band == "within"
    assert figures.gpus_seen == 2


def by(source: str, result: ScrapeResult, url: str = URL) -> ScrapeResult:
    return replace(result, source=source, target=url)


def test_two_proxies_reads_that_cross_are_no_restart() -> None:
    """Two proxy replicas scrape one engine; a's first answer came late, so in time order it
    holds a higher total than b's next, stamped later. Each scraper's growth is in order,
    and the replica's is the most either saw, not the engine's whole total again."""
    results = [
        by("a", engine(0, 0.1, 1500, 900)),
        by("b", engine(1, 0.1, 1200, 700)),
        by("a", engine(10, 0.1, 3000, 1800, done=4)),
        by("b", engine(11, 0.1, 3100, 1850, done=6)),
    ]
    (e,) = gpu_figures(results, SETUP).engines
    assert (e.prefix_queries, e.prefix_hits) == (Figure(1900.0), Figure(1150.0))
    assert e.generation_tokens == Figure(190.0)
    assert e.ttft_p50_ms.value == pytest.approx(100.0)  # b's 6, 3 under 0.1 s; a's 4 not added
    assert (e.answering, e.scrapes) == (1, 4)


def test_a_restart_seen_by_one_scraper_still_counts_all_it_did_since() -> None:
    results = [
        by("a", engine(0, 0.1, 5000, 100)),
        by("a", engine(10, 0.1, 300, 30)),  # the engine restarted: 300 since
        by("a", engine(20, 0.1, 800, 80)),
        by("b", engine(15, 0.1, 400, 40)),
        by("b", engine(25, 0.1, 900, 90)),
    ]
    (e,) = gpu_figures(results, SETUP).engines
    assert e.prefix_queries == Figure(800.0)  # a: 300 + 500, more than b's 500


def test_two_replicas_each_count_their_own_whoever_scraped_them() -> None:
    other = "http://vllm-1:8000/metrics"
    results = [
        by("a", engine(0, 0.1, 100, 0)),
        by("b", engine(1, 0.1, 1000, 0), other),
        by("a", engine(10, 0.1, 400, 0)),
        by("b", engine(11, 0.1, 1200, 0), other),
    ]
    setup = ScrapeSetup(True, "gpu", {"vllm": 2}, "dcgm")
    (e,) = gpu_figures(results, setup).engines
    assert e.prefix_queries == Figure(500.0)
    assert (e.answering, e.replicas) == (2, 2)


def test_scrape_off_says_not_configured_for_every_figure() -> None:
    figures = gpu_figures([], ScrapeSetup(False, "gpu", {"vllm": 1}, ""))
    (e,) = figures.engines
    for figure in (e.kv_usage_mean, e.prefix_hit_ratio, e.ttft_p95_ms, figures.utilisation_pct):
        assert figure == Figure(None, SCRAPE_OFF)
    assert figures.band == "not measured"


def test_no_scrape_in_the_window() -> None:
    (e,) = gpu_figures([], SETUP).engines
    assert e.kv_usage_mean == Figure(None, NO_SAMPLES)


def test_a_failing_scrape_gives_its_last_error() -> None:
    results = [failed(10, "timeout: no whole answer within 5 s"), failed(25, "HTTP 503")]
    (e,) = gpu_figures(results, SETUP).engines
    assert e.kv_usage_mean.value is None
    assert e.kv_usage_mean.reason == (
        f"scrape failing since 1970-01-01 00:00:10 UTC: HTTP 503 ({URL})"
    )
    assert e.failing == ((URL, "HTTP 503"),)
    assert (e.last_error, e.last_error_at, e.failed_scrapes) == ("HTTP 503", 25, 2)


def test_a_replica_failing_beside_a_readable_one_is_named_but_the_figures_stand() -> None:
    other = "http://vllm-1:8000/metrics"
    results = [engine(0, 0.1, 100, 50), failed(0, "HTTP 500", other), engine(15, 0.2, 200, 50)]
    (e,) = gpu_figures(results, ScrapeSetup(True, "gpu", {"vllm": 2}, "dcgm")).engines
    assert e.kv_usage_max == Figure(0.2)
    assert e.prefix_hit_ratio == Figure(0.0)
    assert (e.replicas, e.answering, e.failing) == (2, 1, ((other, "HTTP 500"),))


def test_a_figure_this_vllm_does_not_export_says_so() -> None:
    (e,) = gpu_figures([engine(0, None, 1, 1), engine(9, None, 2, 2)], SETUP).engines
    assert e.kv_usage_mean == Figure(
        None,
        "not exported by this vLLM version (no vllm:kv_cache_usage_perc or "
        "vllm:gpu_cache_usage_perc)",
    )
    assert e.prefix_hit_ratio == Figure(1.0)


def test_one_scrape_gives_gauges_but_no_running_totals() -> None:
    (e,) = gpu_figures([engine(0, 0.4, 100, 50)], SETUP).engines
    assert e.kv_usage_mean == Figure(0.4)
    assert e.prefix_queries == Figure(None, ONE_SAMPLE)
    assert e.prefix_hit_ratio == Figure(None, ONE_SAMPLE)
    assert e.ttft_p50_ms == Figure(None, ONE_SAMPLE)


def test_no_request_finished_gives_no_engine_latency() -> None:
    (e,) = gpu_figures([engine(0, 0.4, 100, 50), engine(5, 0.4, 100, 50)], SETUP).engines
    assert e.ttft_p50_ms == Figure(None, "no request finished in this window")
    assert e.prefix_hit_ratio == Figure(None, "no prompt tokens looked up in this window")


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (ScrapeSetup(True, "gpu", {"vllm": 1}, ""), NO_GPU_SOURCE),
        (ScrapeSetup(True, "cpu", {"vllm": 1}, ""), CPU_BUILD),
        (ScrapeSetup(False, "cpu", {"vllm": 1}, ""), SCRAPE_OFF),
        (ScrapeSetup(True, "gpu", {"vllm": 1}, "dcgm"), NO_SAMPLES),
    ],
)
def test_why_utilisation_is_missing(setup: ScrapeSetup, reason: str) -> None:
    figures = gpu_figures([engine(0, 0.1, 1, 1)], setup)
    assert figures.utilisation_pct == Figure(None, reason)
    assert figures.band == "not measured"


def test_utilisation_is_weighted_by_the_gpus_each_scrape_listed() -> None:
    results = [gpu(0, 90, gpus=1), gpu(0, 60, gpus=3)]  # two exporters, one round
    figures = gpu_figures(results, SETUP)
    assert figures.utilisation_pct == Figure(67.5)
    assert figures.gpus_seen == 4


@pytest.mark.parametrize(
    ("utilisation", "band"),
    [(None, "not measured"), (0.0, "below"), (69.9, "below"), (70.0, "within"),
     (80.0, "within"), (80.1, "above"), (100.0, "above")],
)  # fmt: skip
def test_band(utilisation: float | None, band: str) -> None:
    assert band_of(utilisation) == band
