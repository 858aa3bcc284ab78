"""Decode speed by arm of a 50% split, recorded through a real proxy with the official SDK.

The candidate emulator decodes four times slower than the primary: the report's decode
figures by arm find it, with a 95% interval on the difference of medians that excludes
zero, in every format and on the scorecard. An A/A split (two identical emulators) finds
no difference: its interval holds zero. The order-statistic intervals are conservative
(about 99% coverage at these sample sizes), so an A/A interval excludes zero by chance
less than one run in a hundred."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner
from recording_bed import recorded_config

from kvmigrate.cli import main
from kvmigrate.emulator import EmulatorSettings
from kvmigrate.emulator.settings import latency_for

CONFIG = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout:
  mode: split
  percent: 50
  shadow_sample: 0
  noise_sample: 0
  state: "sqlite:///{db}.state"
record: {{db: "sqlite:///{db}", content: none}}
"""
CONVERSATIONS = 48
TURNS = 2
TOKENS = 24  # every answer's length: the emulators' shortest and longest alike
# Decode tokens per second of one stream: gaps of 10 ms and 40 ms between tokens, far above
# what a busy machine adds per chunk.
FAST, SLOW = 100.0, 25.0


def _emulator(profile: str, decode_tps: float) -> EmulatorSettings:
    latency = latency_for(
        "vllm", ttft_base_s=0.01, ttft_jitter_s=0.0, decode_tokens_per_s=decode_tps
    )
    return EmulatorSettings(
        profile,  # type: ignore[arg-type]
        models=("gpt-4o-mini", "meta-llama/Llama-3.1-8B-Instruct"),
        time_scale=1.0,
        latency=latency,
        min_output_tokens=TOKENS,
        max_output_tokens_default=TOKENS,
    )


def _conversation(client: openai.OpenAI, n: int) -> None:
    messages: list[Any] = [{"role": "user", "content": f"Ticket {n}: the invoice is wrong"}]
    for _ in range(TURNS):
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Session-ID": f"conversation-{n}"},
        )  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "and?"}]


def _drive(client: openai.OpenAI) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: _conversation(client, n), range(CONVERSATIONS)))


@pytest.fixture(scope="module", params=["slower", "a/a"])
def recorded(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    candidate_tps = SLOW if request.param == "slower" else FAST
    emulators = {"hosted": _emulator("vllm", FAST), "vllm": _emulator("vllm", candidate_tps)}
    with recorded_config(
        CONFIG, _drive, CONVERSATIONS * TURNS, prefix="kvmigrate-decode-", emulators=emulators
    ) as path:
        yield request.param, path


def _report(config: Path, *args: str) -> str:
    done = CliRunner().invoke(main, ["report", "--config", str(config), "--since", "all", *args])
    assert done.exit_code == 0, done.output
    return done.output


def _row(text: str, title: str, first: str) -> list[str]:
    """The cells of the row starting with `first` in the text table titled `title`."""
    section = text.split(title + "\n", 1)[1]
    lines = section.splitlines()
    # The rows run from under the header's rule of dashes to the next blank line.
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"-+(  -+)+", line))
    for line in lines[start + 1 :]:
        if not line:
            break
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in {section}")


@pytest.mark.slow
def test_decode_speed_by_arm_finds_the_slower_candidate_and_no_a_a_difference(
    recorded: tuple[str, Path],
) -> None:
    kind, config = recorded
    data = json.loads(_report(config, "--format", "json"))
    served = {b["backend"]: b["serve"] for b in data["backends"]}
    assert sum(served.values()) == CONVERSATIONS * TURNS
    assert served["hosted"] >= 20, served  # it did split
    assert served["vllm"] >= 20, served
    decode = {d["backend"]: d for d in data["decode"]}
    assert list(decode) == ["hosted", "vllm"]
    for name, d in decode.items():
        # Every served answer was a stream with usage: each gives one decode figure.
        assert (d["streams"], d["no_usage"]) == (served[name], 0)
        assert d["tps_p50_low"] <= d["tps_p50"] <= d["tps_p50_high"]
        assert d["tpot_p50_ms"] == pytest.approx(1000 / d["tps_p50"], rel=0.25)
        assert d["gap_max_p95_ms"] >= d["gap_p50_ms"] > 0
    diff = data["decode_difference"]
    assert (diff["primary"], diff["candidate"]) == (
        decode["hosted"]["tps_p50"],
        decode["vllm"]["tps_p50"],
    )
    assert diff["difference"] == pytest.approx(diff["candidate"] - diff["primary"])
    assert diff["low"] <= diff["difference"] <= diff["high"]
    # The emulators pace their tokens: through the proxy a stream is never faster than
    # that (a busy machine only adds to each gap).
    assert decode["hosted"]["tps_p50"] <= FAST * 1.05
    if kind == "slower":
        assert diff["high"] < 0
        assert decode["vllm"]["tps_p50"] <= SLOW * 1.05
        assert decode["vllm"]["tpot_p50_ms"] >= 1000 / SLOW * 0.95
    else:
        assert diff["low"] < 0 < diff["high"]
    by_turn = [(t["turn"], t["primary_n"] + t["candidate_n"]) for t in data["decode_by_turn"]]
    assert by_turn == [("1", CONVERSATIONS), ("2", CONVERSATIONS)]

    text = _report(config)
    for name, d in decode.items():
        cells = _row(text, "Decode speed per stream", name)
        assert cells[:3] == [name, str(served[name]), f"{d['tps_p50']:,.1f} tok/s"]
        assert cells[3] == f"[{d['tps_p50_low']:,.1f}, {d['tps_p50_high']:,.1f}]"
    assert f"vllm - hosted, tok/s p50: {diff['difference']:+,.1f} tok/s" in text


@pytest.mark.slow
def test_the_scorecard_reads_decode_speed_from_its_interval(recorded: tuple[str, Path]) -> None:
    kind, config = recorded
    data = json.loads(_report(config, "--scorecard", "--format", "json"))
    rows = {r["key"]: r for r in data["scorecard"]}
    assert list(rows) == ["ttft", "tps", "flat", "gpu", "cost", "ttft_improvement", "users"]
    tps = rows["tps"]
    full = json.loads(_report(config, "--format", "json"))
    decode = {d["backend"]: d for d in full["decode"]}
    assert (tps["primary"], tps["candidate"]) == (
        decode["hosted"]["tps_p50"],
        decode["vllm"]["tps_p50"],
    )
    assert (tps["low"], tps["high"]) == (
        decode["vllm"]["tps_p50_low"],
        decode["vllm"]["tps_p50_high"],
    )
    # The slower candidate decodes at most 25 tokens per second: surely under 50. The A/A
    # one is paced at 100, but a loaded machine slows what the proxy sees, so its status
    # is read off its interval.
    if kind == "slower" or tps["high"] <= 50:
        status = "missed"
    elif tps["low"] > 50:
        status = "met"
    else:
        status = "not enough evidence"
    assert tps["status"] == status
    # Two turns per conversation: nobody reached turn 10.
    assert rows["flat"]["status"] == "not enough evidence"
    assert rows["flat"]["reason"].startswith("no candidate conversation reached turn 10")
    for key in ("gpu", "users"):
        assert rows[key]["status"] == "not measured"
    # The config scrapes nothing: the GPU row says so, in the scrape's own words.
    assert rows["gpu"]["reason"] == "not configured: gpu.scrape is off"
    assert rows["users"]["reason"].startswith("no ")
    # Cost needs no scrape: the configured replicas' GPU-hours at the default hour price,
    # over the tokens the candidate served, against the hosted price of the primary's.
    arms = {a["arm"]: a for a in full["cost_per_token"]["arms"]}
    own, hosted = arms["candidate"]["self_hosted_usd_per_m"], arms["primary"]["hosted_usd_per_m"]
    assert (rows["cost"]["primary"], rows["cost"]["candidate"]) == (hosted, own)
    assert rows["cost"]["status"] == ("met" if own < hosted else "missed")
    assert full["scorecard"] == data["scorecard"]
    text = _report(config, "--scorecard")
    cells = _row(
        text, "Scorecard (the playbook's checklist)", "Tokens per second per stream above 50"
    )
    assert cells[1:4] == [
        "candidate p50 > 50 tok/s",
        f"{tps['primary']:,.1f} tok/s",
        f"{tps['candidate']:,.1f} tok/s",
    ]
    assert cells[6] == status
    md = _report(config, "--scorecard", "--format", "md")
    assert (
        f"| Tokens per second per stream above 50 | candidate p50 &gt; 50 tok/s | "
        f"{tps['primary']:,.1f} tok/s | {tps['candidate']:,.1f} tok/s |"
    ) in md
    html = _report(config, "--format", "html")
    assert html.count('data-table="scorecard"') == 1
    for key in ("decode", "decode_by_turn", "flatness"):
        assert f'data-table="{key}"' in html
    assert 'data-limit="3000"' in html
