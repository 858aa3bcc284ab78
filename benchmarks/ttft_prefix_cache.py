"""TTFT by turn with vLLM's prefix cache and without it: the timing side of
tests/bench/test_bench_real_vllm.py, which asserts only what the engine reports.

    .venv/bin/python benchmarks/ttft_prefix_cache.py

Starts the test bed's two CPU vLLM servers (the "bench" model shape) one after the other,
runs the same 6 conversations x 8 turns on each, and prints the TTFT table, the turn-8
ratio (without / with the cache) and how TTFT grows from turns 2-4 to turns 6-8. On the
quiet 2-core machine the ratio was about 4 (135 ms against 550 ms); under load it fell to
1.34 while the cached-token counts were unchanged, which is why the test does not assert it.
"""

from __future__ import annotations

import asyncio
import statistics

from kvmigrate.bench import RunSettings, Summary, Target, run_bench, summarize, synthetic
from kvmigrate.bench.render import table
from kvmigrate.testbed.tiny_model import ensure_tiny_model
from kvmigrate.testbed.vllm_server import VllmServer
from kvmigrate.testbed.vllm_venv import ensure_vllm_venv

CONVERSATIONS, TURNS, SYSTEM_WORDS, TURN_WORDS = 6, 8, 250, 100


def bench(server: VllmServer) -> Summary:
    conversations = synthetic(CONVERSATIONS, TURNS, SYSTEM_WORDS, TURN_WORDS, seed=1)
    settings = RunSettings(concurrency=1, max_tokens=16)
    return summarize(asyncio.run(run_bench(Target(server.base_url), conversations, settings)))


def median_ttft(summary: Summary, turns: range) -> float:
    return statistics.median(t.ttft_p50 for t in summary.turns if t.turn in turns)


def main() -> None:
    python = ensure_vllm_venv()
    model = ensure_tiny_model("bench", python)
    with VllmServer(model, served_model_name="bench", python=python) as server:
        cached = bench(server)
    with VllmServer(model, served_model_name="bench", prefix_caching=False, python=python) as s:
        uncached = bench(s)
    print(table(cached, uncached))
    ratio = uncached.turns[-1].ttft_p50 / cached.turns[-1].ttft_p50
    early, late = range(2, 5), range(6, 9)
    print(f"turn-8 TTFT p50 without/with cache: {ratio:.2f}")
    print(
        "TTFT growth turns 6-8 over 2-4: "
        f"{median_ttft(uncached, late) / median_ttft(uncached, early):.2f} without, "
        f"{median_ttft(cached, late) / median_ttft(cached, early):.2f} with the cache"
    )


if __name__ == "__main__":
    main()
