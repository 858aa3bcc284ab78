"""A streamed answer through the proxy keeps the chunk timing of a direct call."""

from __future__ import annotations

import itertools
import statistics
import time

import openai
from proxy_support import HOSTED_MODEL, VLLM_MODEL, ProxyFactory

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.emulator.settings import LatencySettings
from kvmigrate.serving import BackgroundServer

# 40 tokens/s: a 25 ms gap between chunks, far above scheduling noise.
PACED = LatencySettings(
    ttft_base_s=0.05,
    ttft_jitter_s=0.0,
    prefill_tokens_per_s=1e6,
    cached_token_cost=0.0,
    decode_tokens_per_s=40.0,
    engine_concurrency=8,
)


def arrival_times(client: openai.OpenAI, model: str) -> list[float]:
    start = time.perf_counter()
    times = []
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Explain prefix caching."}],
        stream=True,
        max_tokens=24,
        seed=3,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter() - start)
    return times


def test_chunks_are_relayed_as_they_arrive(make_proxy: ProxyFactory) -> None:
    settings = EmulatorSettings(profile="vllm", time_scale=1.0, latency=PACED, noise=0.0)
    with BackgroundServer(lambda: build_app(settings)) as paced:
        proxy = make_proxy(rollout="{mode: split, percent: 100}", vllm_url=paced.url)
        direct = openai.OpenAI(base_url=paced.url + "/v1", api_key="x", max_retries=0)
        try:
            direct_times = arrival_times(direct, VLLM_MODEL)
        finally:
            direct.close()
        proxied_times = arrival_times(proxy.client(), HOSTED_MODEL)
    assert len(proxied_times) == len(direct_times) >= 10
    direct_gaps = [b - a for a, b in itertools.pairwise(direct_times)]
    proxied_gaps = [b - a for a, b in itertools.pairwise(proxied_times)]
    # Buffering would bunch chunks together (gaps near 0) or delay the first one.
    assert abs(statistics.median(proxied_gaps) - statistics.median(direct_gaps)) < 0.008
    # A scheduling hiccup on a busy machine can shorten a gap or two; buffering shortens most.
    assert sum(gap < 0.005 for gap in proxied_gaps) <= len(proxied_gaps) // 5
    assert abs(proxied_times[0] - direct_times[0]) < 0.030
    total_spread = proxied_times[-1] - proxied_times[0]
    assert total_spread > 0.8 * (direct_times[-1] - direct_times[0])
