"""The metrics addon tallies exchanges off the Prometheus metrics and folds them in at every
scrape and every second: what a scrape reads must be what per-exchange updates gave."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import Histogram
from prometheus_client.samples import Sample

from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.exchange import Exchange, Role
from kvmigrate.proxy.metrics import (
    LATENCY_BUCKETS,
    OVERHEAD_BUCKETS,
    ProxyMetrics,
    add_observations,
)
from kvmigrate.proxy.metrics_addon import FOLD_INTERVAL_S, MetricsAddon

COMPLETION = (
    b'{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":'
    b'"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":812,'
    b'"completion_tokens":14,"total_tokens":826,"prompt_tokens_details":{"cached_tokens":768}}}'
)


def exchange(
    duration: float,
    ttft: float | None = None,
    status: int | None = 200,
    error: str | None = None,
    role: Role = Role.SERVE,
) -> Exchange:
    started = 0.0  # so that a duration is the value itself, to the last bit
    done = Exchange("r", "chat/completions", "vllm", role, "m", "m", "h:c", 1, ttft is not None,
                    started, b"{}", status, error)  # fmt: skip
    done.first_byte = started + (ttft if ttft is not None else duration)
    done.finished = started + duration
    if status == 200 and ttft is None:
        done.chunks = [COMPLETION]
    return done


def samples(histogram: Histogram) -> list[Sample]:
    """Its samples, less the creation times (two histograms never share those)."""
    return [s for m in histogram.collect() for s in m.samples if not s.name.endswith("_created")]


EDGES = [0.0, *LATENCY_BUCKETS, LATENCY_BUCKETS[0] + 1e-9, 0.0049999, 160.0001, 1e9]


@pytest.mark.parametrize(
    "values",
    [
        [],
        [0.0],
        EDGES,
        [0.003] * 5 + [2.5, 2.5, 80.0],
    ],
)
def test_folded_observations_read_as_observed_ones(values: list[float]) -> None:
    direct, folded = ProxyMetrics(), ProxyMetrics()
    addon = MetricsAddon(folded)
    for value in values:
        direct.latency.labels("vllm", "serve", "").observe(value)
        direct.ttft.labels("vllm", "serve", "").observe(value / 2)
        addon.exchange_done(exchange(value, ttft=value / 2))
    folded.render()  # a scrape folds what was tallied
    for direct_metric, folded_metric in (
        (direct.latency, folded.latency),
        (direct.ttft, folded.ttft),
    ):
        assert samples(folded_metric) == samples(direct_metric)


def test_an_unlabelled_histogram_folds_too() -> None:
    """The proxy's own overhead, observed on every request through the same tally."""
    direct, folded = ProxyMetrics(), ProxyMetrics()
    for value in [0.0, *OVERHEAD_BUCKETS, 0.00011, 0.3, 0.00004]:
        direct.overhead.observe(value)
        folded.observe(folded.overhead, value)
    folded.render()
    assert samples(folded.overhead) == samples(direct.overhead)


def test_counters_fold_per_label_set_and_a_fold_adds_only_what_is_new() -> None:
    metrics = ProxyMetrics()
    addon = MetricsAddon(metrics)
    for _ in range(3):
        addon.exchange_done(exchange(0.2))
    addon.exchange_done(exchange(0.1, status=503))
    addon.exchange_done(exchange(0.1, status=None, error="timeout", role=Role.SHADOW))
    text = metrics.render().decode()
    assert (
        'kvmigrate_requests_total{backend="vllm",cohort="",role="serve",route="chat/completions",status="200"} 3.0'
        in text
    )
    assert (
        'kvmigrate_errors_total{backend="vllm",cohort="",error="http_503",role="serve"} 1.0' in text
    )
    assert (
        'kvmigrate_errors_total{backend="vllm",cohort="",error="timeout",role="shadow"} 1.0' in text
    )
    assert 'kvmigrate_tokens_total{backend="vllm",kind="prompt",role="serve"} 2436.0' in text
    assert 'kvmigrate_tokens_total{backend="vllm",kind="cached",role="serve"} 2304.0' in text
    addon.exchange_done(exchange(0.2))
    again = metrics.render().decode()  # folded twice: the first three are not counted again
    assert 'role="serve",route="chat/completions",status="200"} 4.0' in again
    assert (
        'kvmigrate_request_duration_seconds_count{backend="vllm",cohort="",role="serve"} 5.0'
        in again
    )


def test_the_conversation_identity_count_folds_with_the_rest() -> None:
    """The identity resolver counts each request by source in a dict; the service folds it
    into its Prometheus counter with the tally, once per request, however often it folds."""
    metrics = ProxyMetrics()
    resolver = ContinuityResolver()
    resolver.register_metrics(metrics.registry)
    metrics.fold_also(resolver.fold_counts)
    opening = {"model": "m", "messages": [{"role": "user", "content": "start the job"}]}

    async def identify(times: int, headers: dict[str, str]) -> None:
        for _ in range(times):
            await resolver.identify(headers, opening, "m", "chat/completions")

    def counted(text: str) -> dict[str, str]:
        prefix = "kvmigrate_conversation_identity_total{source="
        return {
            line[len(prefix) + 1 : line.index('"}')]: line.rsplit(" ", 1)[1]
            for line in text.splitlines()
            if line.startswith(prefix) and not line.endswith(" 0.0")
        }

    asyncio.run(identify(3, {}))
    asyncio.run(identify(2, {"x-session-id": "s-1"}))
    assert counted(metrics.render().decode()) == {"opening": "3.0", "header": "2.0"}
    metrics.fold()  # the addon's timer, between two scrapes
    asyncio.run(identify(1, {}))
    assert counted(metrics.render().decode()) == {"opening": "4.0", "header": "2.0"}


def test_a_running_addon_folds_every_interval_without_a_scrape() -> None:
    """With `--workers` another worker's scrape reads this one's metrics from their files:
    they must get there without a scrape of this worker."""

    async def run() -> float:
        metrics = ProxyMetrics()
        addon = MetricsAddon(metrics)
        await addon.running()
        addon.exchange_done(exchange(0.2))
        child = metrics.latency.labels("vllm", "serve", "")
        async with asyncio.timeout(10 * FOLD_INTERVAL_S):
            while not samples(metrics.latency) or child._sum.get() == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        await addon.done()
        return float(child._sum.get())

    assert asyncio.run(run()) == pytest.approx(0.2)


def test_bucket_counts_must_match_the_histogram() -> None:
    histogram = ProxyMetrics().latency.labels("vllm", "serve", "")
    with pytest.raises(ValueError, match="bucket counts"):
        add_observations(histogram, [1.0, 2.0], 3.0)
