"""The latency model: prefill cost, cached discount, FIFO queueing. Ratios, never absolutes."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from emulator_support import StartEmulator, async_client, client, model_of

from kvmigrate.emulator import LatencySettings
from kvmigrate.emulator.latency import LatencyModel
from kvmigrate.serving import BackgroundServer


def _ttft(server: BackgroundServer, messages: list[dict[str, str]]) -> float:
    with client(server) as sdk:
        started = time.perf_counter()
        stream = sdk.chat.completions.create(
            model=model_of(server),
            messages=messages,  # type: ignore[arg-type]
            stream=True,
            max_tokens=3,
        )
        ttft = 0.0
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and not ttft:
                ttft = time.perf_counter() - started
    return ttft


def test_vllm_defaults_match_h200_measurements() -> None:
    model = LatencyModel(LatencySettings.vllm(), time_scale=1.0, rng=random.Random(0))
    assert model.prefill_s(10_150, 0) == pytest.approx(0.327, rel=0.03)
    assert model.prefill_s(10_150, 9_450) == pytest.approx(0.050, rel=0.05)
    assert LatencyModel(LatencySettings.vllm(), 0.0, random.Random(0)).prefill_s(10_150, 0) == 0


def test_cached_prompt_has_smaller_ttft(start_emulator: StartEmulator) -> None:
    server = start_emulator("vllm", time_scale=1.0)
    messages = [{"role": "user", "content": "history of the world, in detail. " * 800}]
    cold = _ttft(server, messages)
    warm = _ttft(server, messages)
    assert cold > 3 * warm


def test_hosted_cached_prefix_is_discounted(start_emulator: StartEmulator) -> None:
    latency = LatencySettings.hosted()
    steady = LatencySettings(0.01, 0.0, latency.prefill_tokens_per_s, 0.25, 1000.0, 8)
    server = start_emulator("hosted", time_scale=0.5, latency=steady)
    messages = [{"role": "user", "content": "ledger entries and totals " * 1500}]
    cold = _ttft(server, messages)
    warm = _ttft(server, messages)
    assert cold > 1.8 * warm


def test_concurrent_prefills_queue_fifo(start_emulator: StartEmulator) -> None:
    queued = LatencySettings(0.1, 0.0, 1e9, 0.0, 1000.0, engine_concurrency=1)
    server = start_emulator("vllm", time_scale=1.0, latency=queued)

    async def run() -> list[float]:
        async with async_client(server) as sdk:

            async def one(index: int) -> float:
                started = time.perf_counter()
                await sdk.chat.completions.create(
                    model=model_of(server),
                    messages=[{"role": "user", "content": f"question {index}"}],
                    max_tokens=1,
                )
                return time.perf_counter() - started

            return list(await asyncio.gather(*(one(i) for i in range(4))))

    durations = sorted(asyncio.run(run()))
    # One prefill slot: the fourth request waits for three prefills before its own.
    assert durations[-1] > 2.5 * durations[0]


def test_decode_rate_paces_stream(start_emulator: StartEmulator) -> None:
    slow = LatencySettings(0.0, 0.0, 1e9, 0.0, decode_tokens_per_s=100.0, engine_concurrency=4)
    server = start_emulator("vllm", time_scale=1.0, latency=slow)
    with client(server) as sdk:
        started = time.perf_counter()
        sdk.chat.completions.create(
            model=model_of(server), messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        short = time.perf_counter() - started
        started = time.perf_counter()
        sdk.chat.completions.create(
            model=model_of(server), messages=[{"role": "user", "content": "hi"}], max_tokens=30
        )
        long = time.perf_counter() - started
    assert long > 3 * short
