"""Chunk timing of a streamed answer, direct from a paced emulator and through the proxy.

The test (tests/proxy/test_stream_timing.py) proves in lockstep that the proxy relays every
chunk before the upstream sends the next; this prints what that costs in time. Both clients
are warmed up first, so neither pays the SDK's first-call cost in the figures.

    python benchmarks/stream_relay_timing.py [--runs 5]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import openai

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.emulator.settings import LatencySettings
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer

HOSTED_MODEL = "gpt-4o-mini"
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
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


def figures(times: list[float]) -> tuple[float, float, float]:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return times[0], statistics.median(gaps), times[-1] - times[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    settings = EmulatorSettings(profile="vllm", time_scale=1.0, latency=PACED, noise=0.0)
    with BackgroundServer(lambda: build_app(settings)) as paced:
        config = parse_config(
            f"""
backends:
  hosted: {{api_base: "{paced.url}/v1"}}
  vllm: {{api_base: "{paced.url}/v1"}}
models:
  - {{model_name: {HOSTED_MODEL}, hosted: {HOSTED_MODEL}, vllm: {VLLM_MODEL}}}
rollout: {{mode: split, percent: 100}}
""",
            env={},
        )
        with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
            direct = openai.OpenAI(base_url=paced.url + "/v1", api_key="x", max_retries=0)
            proxied = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
            arrival_times(direct, VLLM_MODEL)  # warm-up: connections, the SDK's first call
            arrival_times(proxied, HOSTED_MODEL)
            print("run   first chunk ms (direct/proxy)    median gap ms  spread ratio")
            for run in range(args.runs):
                d_first, d_gap, d_spread = figures(arrival_times(direct, VLLM_MODEL))
                p_first, p_gap, p_spread = figures(arrival_times(proxied, HOSTED_MODEL))
                print(
                    f"{run:>3} {d_first * 1000:>14.1f} / {p_first * 1000:<13.1f}"
                    f" {d_gap * 1000:>6.1f} / {p_gap * 1000:<7.1f} {p_spread / d_spread:>13.2f}"
                )
            direct.close()
            proxied.close()


if __name__ == "__main__":
    main()
