"""Anthropic Messages exchanges recorded by the proxy, exported by `report
--export-requests` with their route, and replayed by `kvmigrate parity` to /v1/messages:
a real proxy in front of the anthropic-profile emulator (primary) and the vLLM-profile one
(candidate), the official anthropic SDK as the client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
from click.testing import CliRunner
from parity_support import VLLM_MODEL, emulator

from kvmigrate.cli import main
from kvmigrate.config import load_config
from kvmigrate.proxy import build_proxy_app
from kvmigrate.recorder.addon import build_recorder
from kvmigrate.serving import BackgroundServer

CLAUDE = "claude-sonnet-4-5"
KEY = "sk-ant-api03-REPLAY-KEY"
QUESTIONS = ["Name a volcano.", "Why do glaciers move?", "How does sourdough rise?"]


def write_config(path: Path, primary_url: str, candidate_url: str) -> Path:
    path.write_text(
        f"""
backends:
  hosted: {{type: anthropic, api_base: "{primary_url}/v1", api_key: {KEY}}}
  vllm: {{api_base: "{candidate_url}/v1"}}
models:
  - {{model_name: {CLAUDE}, hosted: {CLAUDE}, vllm: {VLLM_MODEL}}}
rollout: {{mode: shadow, noise_sample: 0, state: "sqlite:///{path.parent}/state.db"}}
record: {{db: "sqlite:///{path.parent}/records.db", content: redacted}}
"""
    )
    return path


def record_messages(config_path: Path) -> None:
    """Three Messages exchanges (one streamed) through a recording proxy."""
    config = load_config(config_path, env={})
    recorder = build_recorder(config)
    proxy = BackgroundServer(lambda: build_proxy_app(config, addons=[recorder])).start()
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    try:
        for index, question in enumerate(QUESTIONS):
            kwargs: dict[str, Any] = {
                "model": CLAUDE,
                "max_tokens": 32,
                "messages": [{"role": "user", "content": question}],
            }
            if index == 0:
                with client.messages.stream(**kwargs) as stream:
                    assert stream.get_final_message().content
            else:
                assert client.messages.create(**kwargs).content
    finally:
        client.close()
        proxy.stop()  # flushes the recorder


def test_recorded_messages_are_exported_with_their_route_and_replayed_to_messages(
    tmp_path: Path,
) -> None:
    with emulator("anthropic", api_key=KEY) as primary, emulator("vllm") as candidate:
        config = write_config(tmp_path / "config.yaml", primary.url, candidate.url)
        record_messages(config)
        exported = tmp_path / "requests.jsonl"
        runner = CliRunner()
        done = runner.invoke(
            main,
            ["report", "--config", str(config), "--since", "all",
             "--export-requests", str(exported)],
        )  # fmt: skip
        assert done.exit_code == 0, done.output
        lines = [json.loads(line) for line in exported.read_text().splitlines()]
        assert [line["url"] for line in lines] == ["/v1/messages"] * len(QUESTIONS)
        assert {line["body"]["model"] for line in lines} == {CLAUDE}  # the client's name
        replay = runner.invoke(
            main,
            ["parity", "--config", str(config), "--dataset", str(exported),
             "--repeats", "1", "--concurrency", "2", "--json"],
            catch_exceptions=False,
        )  # fmt: skip
    report = json.loads(replay.stdout)
    assert report["requests"] == len(QUESTIONS)
    assert report["candidate_pairs"] == len(QUESTIONS)
    assert report["errors"] == {"primary": {}, "candidate": {}}
