"""The bench against real vLLM CPU servers: prefix caching on against `--no-enable-prefix-caching`.

Uses the "bench" model shape (hidden 512, 4 layers), where prefill cost is visible on a CPU.
The two servers start one after the other (about 35 s each on 2 cores), and each runs the
same conversations one at a time, so the timings compare like with like. Assertions use
medians over several turns and ratios with wide margins: this machine may be loaded.

The server without caching is also started without a tool parser, and the doctor must name
both fixes for it: a real misconfigured engine.

Measured on the 2-core test machine (6 conversations x 8 turns, 250-word system prompt,
100-word turns, 16 output tokens): turn-8 TTFT p50 about 135 ms with the cache against
550 ms without, a ratio of about 4; without the cache TTFT grows about 4.5x from turn 1 to 8.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.bench import RunSettings, Summary, Target, run_bench, summarize, synthetic
from kvmigrate.bench.render import table
from kvmigrate.cli import main
from kvmigrate.testbed.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

# Turn 8 stays under the test bed's --max-model-len 2048 (about 1,600 prompt tokens).
CONVERSATIONS, TURNS, SYSTEM_WORDS, TURN_WORDS = 6, 8, 250, 100


@pytest.fixture(scope="module")
def bench_model() -> tuple[Path, Path]:
    from kvmigrate.testbed.tiny_model import ensure_tiny_model
    from kvmigrate.testbed.vllm_venv import ensure_vllm_venv

    python = ensure_vllm_venv()
    return ensure_tiny_model("bench", python), python


def _bench(server: VllmServer) -> Summary:
    conversations = synthetic(CONVERSATIONS, TURNS, SYSTEM_WORDS, TURN_WORDS, seed=1)
    settings = RunSettings(concurrency=1, max_tokens=16)
    return summarize(asyncio.run(run_bench(Target(server.base_url), conversations, settings)))


@pytest.fixture(scope="module")
def runs(bench_model: tuple[Path, Path]) -> Iterator[dict[str, object]]:
    model, python = bench_model
    results: dict[str, object] = {}
    with VllmServer(model, served_model_name="bench", python=python) as server:
        results["cached"] = _bench(server)
    with VllmServer(
        model, served_model_name="bench", prefix_caching=False, tool_calling=False,
        python=python,
    ) as server:  # fmt: skip
        results["uncached"] = _bench(server)
        results["doctor"] = CliRunner().invoke(main, ["doctor", "--base-url", server.base_url])
    return results


@pytest.mark.slow
def test_the_cache_serves_each_turns_prefix_and_without_it_nothing(
    runs: dict[str, object], record_property: pytest.RecordProperty
) -> None:
    """What the engine reports, not how long it took: on a loaded 2-core machine the TTFT
    ratio fell to 1.34 while the cache did its job (issue 21 item 13). The timing figures
    are printed here and measured in benchmarks/ttft_prefix_cache.py."""
    cached, uncached = runs["cached"], runs["uncached"]
    assert isinstance(cached, Summary)
    assert isinstance(uncached, Summary)
    print("\n" + table(cached, uncached))
    assert cached.errors == 0
    assert uncached.errors == 0
    assert [t.turn for t in cached.turns] == list(range(1, TURNS + 1))

    # The server's own accounting: most of every later prompt cached, or none of it.
    for stats in cached.turns[1:]:
        assert stats.cached_share is not None
        assert stats.cached_share > 0.6  # whole 32-token blocks: turn 2 is about 0.7
    assert all(t.cached_tokens == 0 for t in uncached.turns)
    # Each turn reuses all of the previous turn's prompt, less a partial 32-token block:
    # the prefill left to do stays about one turn long while the prompt grows.
    for before, after in itertools.pairwise(cached.turns):
        assert before.prompt_tokens is not None
        assert after.cached_tokens is not None
        assert after.cached_tokens >= before.prompt_tokens - 32
    uncomputed = [t.prompt_tokens - (t.cached_tokens or 0) for t in cached.turns[1:]]  # type: ignore[operator]
    assert max(uncomputed) < 2 * min(uncomputed) + 64
    assert uncached.turns[-1].prompt_tokens > 4 * max(uncomputed)  # type: ignore[operator]

    ratio = uncached.turns[-1].ttft_p50 / cached.turns[-1].ttft_p50
    record_property("turn8_ttft_ratio_uncached_over_cached", round(ratio, 2))
    print(f"turn-8 TTFT p50 without/with cache: {ratio:.2f} (a figure, not a check)")


def test_doctor_names_the_fixes_for_the_misconfigured_server(runs: dict[str, object]) -> None:
    result = runs["doctor"]
    output = result.stdout  # type: ignore[attr-defined]
    print("\n" + output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (  # type: ignore[attr-defined]
        result.exception  # type: ignore[attr-defined]
    )
    assert result.exit_code == 1  # type: ignore[attr-defined]
    assert "FAIL  prefix caching" in output
    assert "fix: start vLLM with --enable-prefix-caching" in output
    assert "FAIL  tool calling" in output
    assert "--enable-auto-tool-choice --tool-call-parser" in output
    assert "ok    prompt-token details" in output
