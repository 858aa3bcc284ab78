"""The emulator's latency model, measured: cold/warm TTFT ratios (vLLM-like and hosted-like
defaults), FIFO prefill queueing, and `kvmigrate bench`'s turn ratios with the prefix cache and
without. tests/emulator/test_emulator_latency.py and tests/bench/test_bench_emulator.py hold
what the servers report and each figure to its plan; this prints the ratios, which only mean
something on a quiet machine.

    python benchmarks/emulator_latency.py
"""

from __future__ import annotations

import asyncio
import time

import openai

from kvmigrate.bench import RunSettings, Target, run_bench, summarize, synthetic
from kvmigrate.emulator import EmulatorSettings, LatencySettings, build_app, latency_for
from kvmigrate.serving import BackgroundServer

PROMPT = [{"role": "user", "content": "history of the world, in detail. " * 800}]


def ttft(url: str, model: str) -> float:
    with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as sdk:
        started = time.perf_counter()
        for chunk in sdk.chat.completions.create(
            model=model,
            messages=PROMPT,
            stream=True,
            max_tokens=3,  # type: ignore[arg-type]
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                return time.perf_counter() - started
    return time.perf_counter() - started


def served(settings: EmulatorSettings) -> BackgroundServer:
    return BackgroundServer(lambda: build_app(settings))


def cold_warm(profile: str, latency: LatencySettings) -> None:
    settings = EmulatorSettings(profile=profile, time_scale=1.0, latency=latency)  # type: ignore[arg-type]
    with served(settings) as server:
        model = settings.served_models[0]
        cold, warm = ttft(server.url, model), ttft(server.url, model)
    print(
        f"{profile:>7} cold/warm TTFT: {cold * 1000:7.1f} / {warm * 1000:6.1f} ms"
        f" = {cold / warm:5.2f}x"
    )


def fifo() -> None:
    latency = LatencySettings(0.1, 0.0, 1e9, 0.0, 1000.0, engine_concurrency=1)
    settings = EmulatorSettings(profile="vllm", time_scale=1.0, latency=latency)
    with served(settings) as server:

        async def run() -> list[float]:
            async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x") as sdk:

                async def one(i: int) -> float:
                    started = time.perf_counter()
                    await sdk.chat.completions.create(
                        model=settings.served_models[0],
                        messages=[{"role": "user", "content": f"question {i}"}],
                        max_tokens=1,
                    )
                    return time.perf_counter() - started

                return sorted(await asyncio.gather(*(one(i) for i in range(4))))

        durations = asyncio.run(run())
    print(f"   fifo 4 requests, 1 slot of 100 ms: last/first = {durations[-1] / durations[0]:.2f}x")


def bench_turns() -> None:
    """tests/bench/test_bench_emulator.py's run: TTFT by turn with the prefix cache and without."""
    latency = latency_for("vllm", prefill_tokens_per_s=8000.0, decode_tokens_per_s=2000.0)
    conversations = synthetic(4, 6, system_tokens=200, turn_tokens=200, seed=1)
    settings = RunSettings(concurrency=2, max_tokens=8)
    summaries = []
    for capacity in (2_000_000, 0):
        emulator = EmulatorSettings(profile="vllm", latency=latency, cache_capacity_tokens=capacity)
        with served(emulator) as server:
            run = run_bench(Target(server.url + "/v1"), conversations, settings)
            summaries.append(summarize(asyncio.run(run)))
    warm, cold = summaries
    print(
        f"  bench turn 6/turn 1 without the cache: "
        f"{cold.turns[-1].ttft_p50 / cold.turns[0].ttft_p50:.2f}x; "
        f"turn 6/turn 2 with it: {warm.turns[-1].ttft_p50 / warm.turns[1].ttft_p50:.2f}x; "
        f"turn 6 without/with: {cold.turns[-1].ttft_p50 / warm.turns[-1].ttft_p50:.2f}x"
    )


def main() -> None:
    cold_warm("vllm", LatencySettings.vllm())
    hosted = LatencySettings.hosted()
    cold_warm("hosted", LatencySettings(0.01, 0.0, hosted.prefill_tokens_per_s, 0.25, 1000.0, 8))
    fifo()
    bench_turns()


if __name__ == "__main__":
    main()
