"""Observe mode: the hosted API measured alone, before any candidate exists.

A config with no candidate is observe; so is `mode: observe` with one configured, which then
receives nothing. The proxy serves and records the primary's traffic, the report shows its
slowest long conversations with their cost and what prefix caching would save, and
`kvmigrate rollout` refuses to move a share that has nowhere to go."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from aiohttp import web
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import ConfigError, parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.exchange import Role
from kvmigrate.policies.decision import RolloutSnapshot, decide
from kvmigrate.proxy import build_proxy_app
from kvmigrate.recorder.addon import RecorderAddon
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.recorder.store import open_store
from kvmigrate.report import build_report
from kvmigrate.report.evaluate import slow_conversations
from kvmigrate.report.model import Prices
from kvmigrate.report.render_text import render_text
from kvmigrate.report.rows import Row, fetch_rows
from kvmigrate.rollout.controller import OBSERVE_REFUSAL, RolloutError
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"
ALONE = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini}}
rollout: {{state: "sqlite:///{tmp}/state.db"{rollout}}}
record: {{db: "sqlite:///{tmp}/records.db"}}
"""
BESIDE = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: observe, state: "sqlite:///{tmp}/state.db"}}
record: {{db: "sqlite:///{tmp}/records.db"}}
"""


@pytest.mark.parametrize(
    ("rollout", "error"),
    [
        ("", None),
        (", mode: observe", None),
        (", mode: shadow", "rollout.mode: shadow needs a candidate: name rollout.candidate (a "
         "backend), or use mode: observe to measure the primary alone"),
        (", mode: split, percent: 10", "rollout.mode: split needs a candidate"),
        (", mode: observe, percent: 5", "rollout.percent: observe mode sends the candidate "
         "nothing: leave percent at 0"),
        (", candidate: vllm", "rollout.candidate: must be one of hosted; got 'vllm'"),
        (", mode: watch", "rollout.mode"),
    ],
)  # fmt: skip
def test_a_config_without_a_candidate_observes(
    tmp_path: Path, rollout: str, error: str | None
) -> None:
    text = ALONE.format(hosted="http://127.0.0.1:9", tmp=tmp_path, rollout=rollout)
    if error is None:
        config = parse_config(text, env={})
        assert (config.rollout.mode, config.rollout.candidate) == ("observe", "")
        return
    with pytest.raises(ConfigError) as raised:
        parse_config(text, env={})
    assert error in str(raised.value)


SNAPSHOT = RolloutSnapshot("hosted", "vllm", "observe", 0.0, 1.0, "s", noise_sample=1.0)


@pytest.mark.parametrize("conversation", ["a", "b", "c", "d"])
def test_observe_serves_the_primary_and_shadows_nothing(conversation: str) -> None:
    decision = decide(conversation, SNAPSHOT, candidate_serves_model=True)
    assert (decision.serve, decision.shadow, decision.fallback) == ("hosted", None, None)


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def app(self) -> web.Application:
        app = web.Application()

        async def handle(_request: web.Request) -> web.Response:
            self.calls += 1
            return web.json_response({"error": {"message": "not here"}}, status=500)

        app.router.add_route("*", "/{tail:.*}", handle)
        return app


@pytest.fixture
def servers() -> Iterator[tuple[BackgroundServer, Counting, BackgroundServer]]:
    vllm = Counting()
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
    with hosted, BackgroundServer(vllm.app) as candidate:
        yield hosted, vllm, candidate


def _converse(url: str, turns: int, session: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0)
    messages: list[dict[str, str]] = [{"role": "system", "content": "You plan trips. " * 40}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Day {turn + 1} of trip {session}?"})
        answer = client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            extra_headers={"X-Session-ID": session},
        )
        messages.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    client.close()


def test_observe_records_the_primary_alone_and_reports_slow_conversations(
    tmp_path: Path, servers: tuple[BackgroundServer, Counting, BackgroundServer]
) -> None:
    hosted, vllm, candidate = servers
    config = parse_config(
        BESIDE.format(hosted=hosted.url, vllm=candidate.url, tmp=tmp_path), env={}
    )
    db = f"sqlite:///{tmp_path}/records.db"
    recorder = RecorderAddon(db, worker="thread")
    with BackgroundServer(lambda: build_proxy_app(config, addons=[recorder])) as proxy:
        for i, turns in enumerate((6, 5, 7, 2, 3)):
            _converse(proxy.url, turns, f"s{i}")
    assert vllm.calls == 0  # not one copy, not one key check
    with open_store(db) as store:
        rows, _ = fetch_rows(store, 0, 2e9)
        report = build_report(store, 0, 2e9, primary="hosted", candidate="vllm")
    assert {(r.backend, r.role) for r in rows} == {("hosted", Role.SERVE)}
    slow = report.slow_conversations
    assert (slow.long_conversations, slow.conversations) == (3, 5)
    waited = [c.waited_ms for c in slow.slowest]
    assert waited == sorted(waited, reverse=True)  # the slowest first
    assert sorted(c.turns for c in slow.slowest) == [5, 6, 7]
    assert all(c.cost_usd > 0 for c in slow.slowest)
    assert slow.cost_usd == pytest.approx(sum(c.cost_usd for c in slow.slowest))
    assert report.ttft_by_turn  # latency by turn, the primary's column
    text = render_text(report)
    assert "Slowest conversations (5+ turns)" in text
    assert "3 of 5 conversations had 5+ turns" in text


def _row(turn: int, prompt: int, cached: int, output: int, latency: float = 100.0) -> Row:
    return Row(
        f"r{turn}", float(turn), "hosted", "serve", "c", turn, 200, None, 50.0, latency,
        prompt, cached, output, None, None, None, None, None, None, None,
    )  # fmt: skip


def test_what_caching_would_save_is_the_resent_prefix_not_billed_as_cached() -> None:
    # Each turn resends the last prompt and answer (1000 + 100, then 1200 + 100, ...).
    rows = [_row(1, 1000, 0, 100), _row(2, 1200, 0, 100), _row(3, 1400, 1024, 100),
            _row(4, 1600, 0, 100), _row(5, 1800, 0, 100)]  # fmt: skip
    prices = Prices(input_per_m=2.0, cached_input_per_m=0.5, output_per_m=8.0)
    slow = slow_conversations(rows, prices)
    (c,) = slow.slowest
    # Resent prefixes 1100, 1300 (1024 of it cached: 276), 1500, 1700.
    assert c.cacheable_tokens == 1100 + 276 + 1500 + 1700
    assert c.saving_usd == pytest.approx(c.cacheable_tokens * 1.5 / 1e6)
    assert c.cost_usd == pytest.approx(((7000 - 1024) * 2.0 + 1024 * 0.5 + 500 * 8.0) / 1e6)
    assert (c.turns, c.waited_ms) == (5, 500.0)
    # Four turns are no long conversation.
    assert slow_conversations(rows[:4], prices).long_conversations == 0


def test_rollout_refuses_to_move_a_share_in_observe_mode(tmp_path: Path) -> None:
    text = ALONE.format(hosted="http://127.0.0.1:9", tmp=tmp_path, rollout="")
    config = parse_config(text, env={})
    controller = open_controller(config)
    try:
        with pytest.raises(RolloutError) as raised:
            controller.set_percent(10)
        assert str(raised.value) == OBSERVE_REFUSAL
        with pytest.raises(RolloutError) as raised:
            controller.set_mode("shadow")
        assert str(raised.value) == OBSERVE_REFUSAL
    finally:
        controller.store.close()
    path = tmp_path / "config.yaml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["rollout", "--config", str(path), "--percent", "10"])
    assert result.exit_code != 0
    assert OBSERVE_REFUSAL in result.output
    # The status names no step to take and no gate to wait on.
    status = CliRunner().invoke(main, ["rollout", "status", "--config", str(path)])
    assert status.exit_code == 0, status.output
    assert status.output.splitlines()[0].startswith("mode observe, candidate share 0%")
    assert status.output.splitlines()[-1] == OBSERVE_REFUSAL + "."


@pytest.mark.parametrize(
    "args",
    [["parity", "--dataset", "{d}"], ["doctor"], ["bench"]],
)
def test_commands_that_call_the_candidate_say_there_is_none(
    tmp_path: Path, args: list[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(ALONE.format(hosted="http://127.0.0.1:9", tmp=tmp_path, rollout=""))
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}\n')
    argv = [a.format(d=dataset) for a in args]
    result = CliRunner().invoke(main, [argv[0], "--config", str(path), *argv[1:]])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == (
        f"Error: `kvmigrate {argv[0]}` needs a candidate backend, and this config has none "
        "(rollout.mode: observe measures the primary alone): add the candidate's backend and "
        "name it as rollout.candidate"
    )
