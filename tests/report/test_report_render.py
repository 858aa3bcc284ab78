"""The report over a real recorded session, rendered four ways; the HTML in real Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_page import chromium
from recording_bed import recorded_config

from kvmigrate.recorder import Record, open_store
from kvmigrate.report import RENDERERS, Prices, TimelineEvent, build_report

HOSTED_MODEL = "gpt-4o-mini"
CONFIG = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: shadow, noise_sample: 1.0, noise_per_minute: 100000}}
record: {{db: "sqlite:///{db}", content: redacted}}
"""
TURNS, CONVERSATIONS = 4, 8  # 32 pairs: enough noise pairs (20) for a verdict


@pytest.fixture(scope="module")
def recorded() -> Iterator[Path]:
    """A config whose records DB holds a shadowed multi-turn session through a real proxy."""
    import openai

    def drive(client: openai.OpenAI) -> None:
        for conv in range(CONVERSATIONS):
            messages = [
                {"role": "system", "content": "You are an agent. " * 100},
                {"role": "user", "content": f"Task {conv}: write to ann@example.com"},
            ]
            for _ in range(TURNS):
                # Streamed, as agents do: TTFT is observed on streamed answers only.
                stream = client.chat.completions.create(
                    model=HOSTED_MODEL, messages=messages, max_tokens=8, stream=True,
                    stream_options={"include_usage": True},
                    extra_headers={"X-Session-ID": f"conv-{conv}"},
                )  # fmt: skip
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": "continue " * 20},
                ]

    with recorded_config(
        CONFIG, drive, 3 * TURNS * CONVERSATIONS, 0.02, "kvmigrate-report-"
    ) as path:
        yield path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvmigrate", *args], capture_output=True, text=True, timeout=120
    )


def test_json_report_holds_the_recorded_figures(recorded: Path) -> None:
    proc = _cli("report", "--config", str(recorded), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    # Each turn: the answer, its shadow copy, and a noise call (noise_sample 1.0).
    assert data["records"] == 3 * TURNS * CONVERSATIONS
    backends = {b["backend"]: b for b in data["backends"]}
    assert backends["hosted"]["serve"] == backends["vllm"]["shadow"] == TURNS * CONVERSATIONS
    assert backends["hosted"]["conversations"] == CONVERSATIONS
    assert data["coverage"]["request_ratio"] == 1.0
    assert [row["turn"] for row in data["ttft_by_turn"]] == ["1", "2", "3", "4"]
    for row in data["ttft_by_turn"]:
        assert row["primary_n"] == row["candidate_n"] == CONVERSATIONS
        assert row["primary_p50_ms"] > 0
        assert row["candidate_p50_ms"] > 0
        expected = (row["primary_p50_ms"] - row["candidate_p50_ms"]) / row["primary_p50_ms"] * 100
        assert row["reduction_p50_pct"] == pytest.approx(expected)
    # The emulated vLLM caches each conversation's prefix: later turns hit more.
    hits = [row["hit"]["vllm"] for row in data["cache_by_turn"]]
    assert hits[-1] > hits[0] > 0
    assert data["parity"]["scored"] is True
    assert data["parity"]["samples"] == data["parity"]["noise_pairs"] == TURNS * CONVERSATIONS
    assert 0 <= data["parity"]["noise_adjusted"] <= 1
    assert data["cost"]["hosted_monthly_usd"] > 0
    assert data["cost"]["gpus"] >= 1
    assert "NaN" not in proc.stdout


def test_text_and_md_reports(recorded: Path) -> None:
    text = _cli("report", "--config", str(recorded)).stdout
    assert "TTFT by turn" in text
    assert "noise-adjusted parity" in text
    assert "NaN" not in text
    md = _cli("report", "--config", str(recorded), "--format", "md", "--since", "1h").stdout
    assert "| turn | hosted n | hosted p50" in md
    assert "## Cost projection" in md


def test_export_requests_as_batch_jsonl(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "requests.jsonl"
    proc = _cli(
        "report",
        "--config",
        str(recorded),
        "--export-requests",
        str(out),
        "--out",
        str(tmp_path / "r.txt"),
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == TURNS * CONVERSATIONS  # serve calls only: a shadow is a duplicate
    first = lines[0]
    assert first["url"] == "/v1/chat/completions"
    assert first["method"] == "POST"
    assert first["body"]["model"] == HOSTED_MODEL  # the client's name, not the backend's
    assert "[EMAIL]" in json.dumps(first["body"])
    assert "ann@example.com" not in out.read_text()
    assert {line["metadata"]["turn"] for line in lines} == {1, 2, 3, 4}
    # The records' token counts travel along: `plan --dataset` sizes answers from them.
    for line in lines:
        usage = line["metadata"]["usage"]
        assert usage["prompt_tokens"] > 0
        assert usage["completion_tokens"] > 0


def test_empty_and_missing_databases_say_so(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        CONFIG.format(
            hosted="http://127.0.0.1:9", vllm="http://127.0.0.1:9", db=tmp_path / "none.db"
        )
    )
    for fmt in RENDERERS:
        proc = _cli("report", "--config", str(config), "--format", fmt)
        assert proc.returncode == 0, proc.stderr
        assert "NaN" not in proc.stdout
        if fmt != "json":
            assert "No records in this window" in proc.stdout
    assert not (tmp_path / "none.db").exists()
    with open_store(f"sqlite:///{tmp_path / 'empty.db'}") as store:
        report = build_report(store, since=0)
        assert report.empty
        assert "No records" in report.notes[0]
        # One lonely failed call: tiny, and every missing figure is a dash, not NaN.
        store.insert(
            [
                Record(
                    "r1",
                    time.time(),
                    "chat/completions",
                    "vllm",
                    "shadow",
                    "m",
                    "m",
                    "c",
                    1,
                    False,
                    None,
                    "connect_error",
                )
            ]
        )
        tiny = build_report(store, since=0)
    for render in RENDERERS.values():
        out = render(tiny)
        assert "NaN" not in out
        assert "nan" not in out.replace("Nan", "")
    assert any("anecdotal" in note for note in tiny.notes)


@pytest.mark.slow
@pytest.mark.browser
def test_html_renders_in_headless_chromium_with_the_right_data(
    recorded: Path, tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    assert (
        _cli("report", "--config", str(recorded), "--format", "html", "--out", str(page)).returncode
        == 0
    )
    html = page.read_text()
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # offline
    # One clock reading: two would put the events 300 s plus the time between the readings
    # apart, which a busy machine makes long enough to show (x="300.002", not "300").
    now = time.time()
    events = [
        TimelineEvent(now - 600, "shadow", percent=0.0),
        TimelineEvent(now - 300, "split", "step 1", 10.0),
    ]
    with open_store(f"sqlite:///{recorded.parent / 'records.db'}") as store:
        with_timeline = build_report(store, since=0, prices=Prices(), timeline=events)
    (tmp_path / "timeline.html").write_text(RENDERERS["html"](with_timeline))
    for name in ("report.html", "timeline.html"):
        dom, log = _headless(tmp_path / name, tmp_path)
        assert 'data-ready="1"' in dom
        assert 'data-charts="5"' in dom
        assert ":CONSOLE" not in log, log  # Chromium logs every console message and error so
        for chart in (
            "ttft-by-turn",
            "latency-cdf",
            "cache-by-turn",
            "parity-distribution",
            "rollout-timeline",
        ):
            assert f'data-chart="{chart}"' in dom
    dom, _ = _headless(tmp_path / "report.html", tmp_path)
    data = json.loads(_cli("report", "--config", str(recorded), "--format", "json").stdout)
    for row_index, row in enumerate(data["ttft_by_turn"], start=1):
        expected = (
            f'data-series="vllm p50" data-x="{row_index}" data-y="{row["candidate_p50_ms"]:g}"'
        )
        assert expected in dom
    assert "not yet scored" not in dom
    timeline_dom, _ = _headless(tmp_path / "timeline.html", tmp_path)
    assert 'data-series="vllm" data-x="300" data-y="10"' in timeline_dom


def _headless(page: Path, tmp: Path) -> tuple[str, str]:
    profile = tempfile.mkdtemp(dir=tmp)
    proc = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def _answer(text: str | None = None, call: tuple[str, str] | None = None) -> str:
    message: dict[str, object] = {"role": "assistant", "content": text}
    if call is not None:
        message["tool_calls"] = [
            {"id": "t", "type": "function", "function": {"name": call[0], "arguments": call[1]}}
        ]
    return json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


def _pair_records(
    n: int, primary: str, candidate: str, disagree: list[str], score: float
) -> list[Record]:
    common = {"ts": time.time() - 60 + n, "route": "chat/completions", "model": "m",
              "served_model": "m", "conversation": f"conv-{n}", "turn": 1, "stream": False,
              "status": 200, "content": "redacted"}  # fmt: skip
    return [
        Record(request_id=f"p{n}", backend="hosted", role="serve", response_json=primary,
               **common),  # type: ignore[arg-type]
        Record(request_id=f"c{n}", backend="vllm", role="shadow", pair_id=f"p{n}",
               response_json=candidate, parity_kind="candidate", parity_score=score,
               parity_applicable='["length", "text", "tool_calls", "topic"]',
               parity_disagree=json.dumps(disagree), **common),  # type: ignore[arg-type]
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.browser
def test_divergences_view_shows_pairs_side_by_side_and_filters_in_chromium(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/records.db"
    with open_store(url) as store:
        store.insert(
            [
                *_pair_records(1, _answer("The capital is Paris."),
                               _answer("The capital is Lyon."), ["text"], 0.5),
                *_pair_records(2, _answer(call=("get_weather", '{"city": "Oslo"}')),
                               _answer(call=("get_weather", '{"city": "Lima"}')),
                               ["tool_calls"], 0.0),
                *_pair_records(3, _answer("Short answer."), _answer("Short answer, longer."),
                               ["length"], 0.8),
                *_pair_records(4, _answer("Same."), _answer("Same."), [], 1.0),
            ]
        )  # fmt: skip
        # The primary's own repeat of request 3 differed in length too: within its noise.
        noise = Record(request_id="n3", ts=time.time() - 57, route="chat/completions",
                       backend="hosted", role="noise", model="m", served_model="m",
                       conversation="conv-3", turn=1, stream=False, status=200, pair_id="p3",
                       parity_kind="noise", parity_score=0.8,
                       parity_applicable='["length", "text"]', parity_disagree='["length"]')  # fmt: skip
        store.insert([noise])
        # Records carry the cohort they were routed in (issue 19, migration m008_cohort).
        store.query("UPDATE records SET cohort = 'beta' WHERE request_id = 'c1'")
        store.query("UPDATE records SET cohort = 'alpha' WHERE request_id IN ('c2', 'c3')")
        report = build_report(store, since=0)
    assert [p.request_id for p in report.divergences] == ["c2", "c1", "c3"]  # worst first
    assert [p.verdict for p in report.divergences] == ["diverged", "diverged", "within_noise"]
    assert "pairs that answered differently | 3 (2 beyond their noise;" in RENDERERS["md"](report)
    page = tmp_path / "report.html"
    page.write_text(RENDERERS["html"](report))

    def shown(fragment: str) -> tuple[int, list[str]]:
        target = tmp_path / f"view-{len(fragment)}.html"
        shutil.copy(page, target)
        profile = tempfile.mkdtemp(dir=tmp_path)
        proc = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", "--dump-dom", target.as_uri() + fragment],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        dom = proc.stdout
        count = re.search(r'data-divergences-shown="(\d+)"', dom)
        assert count is not None, dom[-2000:]
        visible = re.findall(r'<div class="pair" data-request="(\w+)"[^>]*?(?<!hidden="")>', dom)
        return int(count.group(1)), visible

    assert shown("") == (3, ["c2", "c1", "c3"])
    assert shown("#comparator=tool_calls") == (1, ["c2"])
    assert shown("#cohort=alpha") == (2, ["c2", "c3"])
    assert shown("#verdict=within_noise") == (1, ["c3"])
    assert shown("#comparator=length&cohort=beta") == (0, [])
    html = page.read_text()
    # The differing words are marked on each side; what both say is not.
    assert "The capital is <del>Paris.</del>" in html
    assert "The capital is <ins>Lyon.</ins>" in html
    assert re.search(r"<del>[^<]*Oslo[^<]*</del>", html)
    assert re.search(r"<ins>[^<]*Lima[^<]*</ins>", html)
    assert "Same." not in html  # a pair that agreed is no divergence
    for cohort in ("alpha", "beta"):
        assert f'<option value="{cohort}">' in html
