"""`kvmigrate bench` against emulated vLLM servers: the library, the CLI, datasets, outputs.

The emulator's latency model prefills uncached tokens at a fixed rate, so a server with its
prefix cache and one without (capacity 0) differ the way a real engine does: later turns
grow without the cache and stay flat with it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.bench import (
    DatasetError,
    RunSettings,
    Target,
    load_dataset,
    percentile,
    reduction,
    run_bench,
    summarize,
    synthetic,
)
from kvmigrate.cli import main
from kvmigrate.emulator import EmulatorSettings, build_app, latency_for
from kvmigrate.emulator.latency import LatencyModel
from kvmigrate.serving import BackgroundServer

# Slow prefill (8,000 tokens/s) so prompt length dominates TTFT; fast decode keeps runs short.
LATENCY = latency_for("vllm", prefill_tokens_per_s=8000.0, decode_tokens_per_s=2000.0)


def _emulator(cache_tokens: int, **extra: object) -> BackgroundServer:
    settings = EmulatorSettings(
        profile="vllm",
        latency=LATENCY,
        cache_capacity_tokens=cache_tokens,
        **extra,  # type: ignore[arg-type]
    )
    return BackgroundServer(lambda: build_app(settings)).start()


@pytest.fixture(scope="module")
def cached() -> Iterator[BackgroundServer]:
    server = _emulator(2_000_000)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def uncached() -> Iterator[BackgroundServer]:
    server = _emulator(0)
    yield server
    server.stop()


def test_turns_stay_flat_with_the_cache_and_grow_without(
    cached: BackgroundServer, uncached: BackgroundServer
) -> None:
    conversations = synthetic(4, 6, system_tokens=200, turn_tokens=200, seed=1)
    settings = RunSettings(concurrency=2, max_tokens=8)
    warm = summarize(asyncio.run(run_bench(Target(cached.url + "/v1"), conversations, settings)))
    cold = summarize(asyncio.run(run_bench(Target(uncached.url + "/v1"), conversations, settings)))
    assert warm.errors == cold.errors == 0
    assert [t.requests for t in warm.turns] == [4] * 6
    last_warm, last_cold = warm.turns[-1], cold.turns[-1]
    # usage: the cache reports most of every later prompt; without it nothing
    assert last_warm.cached_share is not None
    assert last_warm.cached_share > 0.8
    assert last_cold.cached_tokens == 0
    # usage: what each turn had to compute stays flat with the cache, and grows without it
    uncomputed = [t.prompt_tokens - (t.cached_tokens or 0) for t in warm.turns[1:]]  # type: ignore[operator]
    assert max(uncomputed) < 2 * min(uncomputed) + 64
    assert last_cold.prompt_tokens > 4 * max(uncomputed)  # type: ignore[operator]
    # timing: the bench measured at least the prefill the emulator had to do (a sleep never
    # ends early; 0.9 for the median against the mean prompt). The cold/warm ratios are
    # printed by benchmarks/emulator_latency.py.
    model = LatencyModel(LATENCY, 1.0, random.Random(0))
    for turn in cold.turns:
        assert turn.ttft_p50 >= 0.9 * model.prefill_s(int(turn.prompt_tokens or 0), 0)
    assert all(t.prompt_tokens for t in warm.turns)
    assert warm.turns[-1].prompt_tokens > warm.turns[0].prompt_tokens  # type: ignore[operator]


def test_cli_compares_two_endpoints_in_json_and_html(
    cached: BackgroundServer, uncached: BackgroundServer, tmp_path: Path
) -> None:
    chart = tmp_path / "chart.html"
    result = CliRunner().invoke(
        main,
        [
            "bench", "--base-url", cached.url + "/v1", "--vs", uncached.url + "/v1",
            "--conversations", "3", "--turns", "4", "--system-tokens", "600",
            "--turn-tokens", "100", "--max-tokens", "8", "--concurrency", "3",
            "--json", "--html", str(chart),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [t["turn"] for t in report["run"]["turns"]] == [1, 2, 3, 4]
    assert report["run"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert report["vs"]["errors"] == 0
    # The reduction is computed from the two runs' own figures (how large it is, is timing:
    # benchmarks/emulator_latency.py); the cache shows in what the servers report.
    run_turn, vs_turn = report["run"]["turns"][3], report["vs"]["turns"][3]
    assert report["ttft_p50_reduction_pct"]["4"] == pytest.approx(
        reduction(run_turn["ttft_p50_s"], vs_turn["ttft_p50_s"]), abs=0.05
    )
    assert run_turn["cached_tokens"] > 0.5 * run_turn["prompt_tokens"]
    assert vs_turn["cached_tokens"] == 0
    # All streams together: the figure `report --gpu-tokens-per-s` takes.
    assert report["run"]["output_tokens_per_s"] > 0
    page = chart.read_text()
    assert page.startswith("<!doctype html>")
    assert "<svg" in page
    assert "<polyline" in page
    assert "<script" not in page
    assert "src=" not in page
    assert "TTFT reduction" in page


def test_cli_table_shows_turns_and_reduction(
    cached: BackgroundServer, uncached: BackgroundServer
) -> None:
    result = CliRunner().invoke(
        main,
        [
            "bench", "--base-url", cached.url + "/v1", "--vs", uncached.url + "/v1",
            "--conversations", "2", "--turns", "3", "--system-tokens", "300",
            "--turn-tokens", "50", "--max-tokens", "4",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("turn"))
    for column in ("TTFT p50", "p95", "total p50", "tok/s", "cached/prompt", "vs TTFT p50"):
        assert column in header
    assert "TTFT reduction" in header
    rows = [line.split() for line in lines if line.strip()[:1].isdigit() and "ms" not in line]
    assert [row[0] for row in rows] == ["1", "2", "3"]
    [hint] = [line for line in lines if "--gpu-tokens-per-s" in line]
    assert hint.startswith("output ")
    assert float(hint.split()[1]) > 0


def test_cli_fails_cleanly_when_nothing_answers() -> None:
    result = CliRunner().invoke(
        main, ["bench", "--base-url", "http://127.0.0.1:9/v1", "--conversations", "1"]
    )
    assert result.exit_code != 0
    assert "Traceback" not in result.output


def test_server_errors_are_counted_and_skip_the_rest_of_the_conversation() -> None:
    server = _emulator(2_000_000, max_model_len=700)  # later turns outgrow the context
    try:
        conversations = synthetic(2, 4, system_tokens=150, turn_tokens=60, seed=2)
        run = asyncio.run(run_bench(Target(server.url + "/v1"), conversations, RunSettings()))
    finally:
        server.stop()
    summary = summarize(run)
    assert summary.turns[0].errors == 0
    assert summary.turns[-1].errors == 2
    errors = [r.error for r in run.records if r.error]
    assert any(e.startswith("http 400") for e in errors)


def test_synthetic_conversations_never_share_an_opening() -> None:
    first = synthetic(3, 2, 50, 10, seed=5)
    again = synthetic(3, 2, 50, 10, seed=5)
    openings = {c.system[:30] for c in first + again}
    assert len(openings) == 6  # per conversation and per call
    # the same seed gives the same text after the opening
    assert [c.system.split(". ", 1)[1] for c in first] == [
        c.system.split(". ", 1)[1] for c in again
    ]
    assert all(len(c.user_turns) == 2 for c in first)


def test_datasets_in_openai_and_sharegpt_format(tmp_path: Path) -> None:
    path = tmp_path / "conversations.jsonl"
    lines = [
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "one"},
                      {"role": "assistant", "content": "ignored"},
                      {"role": "user", "content": [{"type": "text", "text": "two"}]}]},
        {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "a"},
                           {"from": "gpt", "value": "b"}, {"from": "human", "value": "c"},
                           {"from": "human", "value": "d"}]},
        {"conversations": [{"from": "gpt", "value": "no user turn"}]},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    loaded = load_dataset(path, conversations=10, turns=2)
    assert [(c.system, c.user_turns) for c in loaded] == [
        ("Be brief.", ("one", "two")),
        ("S", ("a", "c")),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [("not json", "not valid JSON"), ('{"prompt": "x"}', "messages"),
     ("[1]", "expected a JSON object, got a list"),
     ('{"conversations": [{"value": "x"}]}', "from")],
)  # fmt: skip
def test_bad_dataset_lines_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(DatasetError, match=message) as info:
        load_dataset(path, 5, 5)
    assert "bad.jsonl:1" in str(info.value)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 50, math.nan), ([3.0], 95, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
     ([1.0, 2.0, 3.0, 4.0], 95, 3.85), ([5.0, 1.0, 3.0], 0, 1.0), ([5.0, 1.0, 3.0], 100, 5.0)],
)  # fmt: skip
def test_percentile(values: list[float], q: float, expected: float) -> None:
    got = percentile(values, q)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "baseline", "expected"),
    [(0.1, 0.4, 75.0), (0.4, 0.4, 0.0), (0.5, 0.25, -100.0), (0.1, 0.0, math.nan)],
)
def test_reduction(value: float, baseline: float, expected: float) -> None:
    got = reduction(value, baseline)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)
