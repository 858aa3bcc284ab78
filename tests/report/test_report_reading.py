"""The report explains itself: where the GPU throughput comes from, why pair scores and the
noise-adjusted figure differ, whose text an excerpt is, what a dash means, what busted the
cache; and its charts use one colour per backend role and readable, unclipped ticks.

A real proxy between emulated backends records a session with streamed and non-streamed
turns, noise calls, and a system prompt whose timestamp changes every turn."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_page import chromium
from recording_bed import recorded_config

from kvmigrate.recorder import open_store
from kvmigrate.render.svg import CANDIDATE_COLOR, PRIMARY_COLOR
from kvmigrate.report import RENDERERS, Prices, TimelineEvent, build_report

CONFIG = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: shadow, noise_sample: 1.0, noise_per_minute: 100000}}
record: {{db: "sqlite:///{db}", content: full}}
cachecheck: {{enabled: false}}
"""
TURNS, CONVERSATIONS, BUSTED = 4, 6, 3  # the first BUSTED conversations stamp the time


@pytest.fixture(scope="module")
def recorded() -> Iterator[Path]:
    import openai

    def drive(client: openai.OpenAI) -> None:
        for conv in range(CONVERSATIONS):
            history = [{"role": "user", "content": f"Task {conv}: fix the parser"}]
            for turn in range(1, TURNS + 1):
                system = "You are a coding agent. " * 60
                if conv < BUSTED:
                    system = f"Current time: 2026-12-01T10:{turn:02d}:07Z. " + system
                messages = [{"role": "system", "content": system}, *history]
                stream = turn != 3  # turn 3 is not streamed: it has no TTFT
                answer = client.chat.completions.create(
                    model="gpt-4o-mini", messages=messages, max_tokens=8, stream=stream,
                    extra_headers={"X-Session-ID": f"conv-{conv}"},
                )  # fmt: skip
                if stream:
                    text = "".join(c.choices[0].delta.content or "" for c in answer)
                else:
                    text = answer.choices[0].message.content or ""
                history += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": "continue " * 10},
                ]

    with recorded_config(
        CONFIG, drive, 3 * TURNS * CONVERSATIONS, 0.01, "kvmigrate-reading-"
    ) as path:
        yield path


def _report(recorded: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "report", "--config", str(recorded), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _section(text: str, title: str) -> str:
    start = text.index(title)
    end = text.find("\n\n", start)
    return text[start : end if end > 0 else None]


def test_cost_projection_says_where_gpu_throughput_comes_from(recorded: Path) -> None:
    cost = _section(_report(recorded), "Cost projection")
    assert "observed peak, a lower bound" in cost
    assert "--gpu-tokens-per-s" in cost
    assert "kvmigrate bench" in cost
    assert "GPUs needed (at most)" in cost
    given = _section(_report(recorded, "--gpu-tokens-per-s", "2500"), "Cost projection")
    assert "given with --gpu-tokens-per-s" in given
    assert "(at most)" not in given


def test_parity_section_reads_right(recorded: Path) -> None:
    text = _report(recorded)
    parity = _section(text, "Parity\n")
    worst = [line for line in parity.splitlines() if line.startswith("worst:")]
    assert worst
    assert not [line for line in worst if "(100.0%)" in line]  # perfect pairs are no divergence
    assert all("vllm's answer: " in line for line in worst)  # whose text the excerpt is
    assert "0% pairs and a high figure can both be true" in text


@pytest.mark.slow
def test_dashes_and_hidden_noise_calls_are_explained(recorded: Path) -> None:
    text = _report(recorded)
    ttft = _section(text, "TTFT by turn")
    [turn3] = [line for line in ttft.splitlines() if line.startswith("3 ")]
    assert "—" in turn3
    assert "no streamed call at that turn" in text
    data = json.loads(_report(recorded, "--format", "json"))
    noise = data["noise_calls"]
    calls = sum(b["requests"] for b in data["backends"])
    assert noise > 0
    assert data["records"] == calls + noise
    foot = f"{data['records']} records: these {calls} calls, and {noise} noise calls"
    assert foot in _section(text, "Headline")
    assert f"Records: {data['records']} calls" in text


def test_cache_buster_section_names_the_cause_and_the_fix(recorded: Path) -> None:
    text = _report(recorded)
    busters = _section(text, "Cache busters")
    [row] = [line for line in busters.splitlines() if line.startswith("timestamp")]
    assert "system" in row
    breaks = BUSTED * (TURNS - 1)
    assert re.search(rf"\b{breaks}\b\s+{BUSTED}\b", row), row  # breaks, conversations
    assert f"{breaks} breaks" in busters
    md = _report(recorded, "--format", "md")
    assert "## Cache busters" in md


def _dom(page: Path, tmp: Path, shot: Path | None = None) -> str:
    profile = tempfile.mkdtemp(dir=tmp)
    args = [f"--screenshot={shot}", "--window-size=1400,4200"] if shot else ["--dump-dom"]
    proc = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         *args, page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.browser
def test_html_footnotes_colours_and_timeline_ticks_in_chromium(
    recorded: Path, tmp_path: Path
) -> None:
    now = time.time()
    events = [  # a short rollout, as the demo makes: minutes would repeat on the axis
        TimelineEvent(now - 200, "shadow", percent=0.0),
        TimelineEvent(now - 120, "split", "step 1", 10.0),
        TimelineEvent(now - 40, "split", "step 2", 50.0),
    ]
    with open_store(f"sqlite:///{recorded.parent / 'records.db'}") as store:
        report = build_report(store, since=0, until=now, prices=Prices(), timeline=events)
    page = tmp_path / "report.html"
    page.write_text(RENDERERS["html"](report))
    dom = _dom(page, tmp_path)
    shot = tmp_path / "report.png"
    _dom(page, tmp_path, shot)  # looked at by hand when this test was written
    assert shot.stat().st_size > 10_000
    for key in ("headline", "ttft_by_turn", "parity", "cache_busters"):
        assert f'data-footnote="{key}"' in dom
    # One colour per role: the hosted primary blue, the self-hosted candidate orange.
    assert 'data-series="hosted p50" data-x="1"' in dom
    assert re.search(rf'fill="{PRIMARY_COLOR}" data-series="hosted p50"', dom)
    assert re.search(rf'fill="{CANDIDATE_COLOR}" data-series="vllm p50"', dom)
    timeline = dom[dom.index('data-chart="rollout-timeline"') :]
    timeline = timeline[: timeline.index("</svg>")]
    ticks = re.findall(r'text-anchor="(\w+)" class="tick">([^<]+)<', timeline)
    x_ticks = [(anchor, label) for anchor, label in ticks if ":" in label]
    labels = [label for _, label in x_ticks]
    assert len(labels) == len(set(labels)) >= 3, labels  # no minute repeated five times
    assert x_ticks[-1][0] == "end"  # the last label ends at the edge instead of running off


def test_bench_chart_uses_the_report_colours(tmp_path: Path) -> None:
    from kvmigrate.bench.chart import COLOURS

    # The measured endpoint is the self-hosted candidate; --vs is the hosted API.
    assert COLOURS == (CANDIDATE_COLOR, PRIMARY_COLOR)
