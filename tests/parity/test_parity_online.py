"""Online parity: the proxy scores each shadow copy against the answer it copied, sends a
budgeted share of requests to the primary twice for the noise floor, and the gates and the
report read the noise-adjusted figure back from the records."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from settling import wait_settled

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.recorder.queries import window_stats
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_code",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def emulators() -> Iterator[tuple[BackgroundServer, BackgroundServer]]:
    hosted = BackgroundServer(
        lambda: build_app(
            EmulatorSettings("hosted", time_scale=0, noise=0.2, answer_family="agent")
        )
    )
    vllm = BackgroundServer(
        lambda: build_app(EmulatorSettings("vllm", time_scale=0, noise=0.2, answer_family="agent"))
    )
    with hosted, vllm:
        yield hosted, vllm


def test_shadow_pairs_are_scored_and_noise_adjusted(
    tmp_path: Path,
    emulators: tuple[BackgroundServer, BackgroundServer],
) -> None:
    hosted, vllm = emulators
    config_path = tmp_path / "config.yaml"
    config_path.write_text(f"""
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{vllm.url}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout:
  mode: shadow
  shadow_sample: 1.0
  noise_sample: 1.0
  noise_per_minute: 1000
  state: "sqlite:///{tmp_path}/state.db"
record: {{db: "sqlite:///{tmp_path}/records.db"}}
""")
    config = parse_config(config_path.read_text(), env={})
    started = time.time()
    with (
        BackgroundServer(lambda: build_runtime_app(config)) as proxy,
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0) as client,
    ):
        for i in range(40):
            kwargs = {"tools": TOOLS} if i % 2 else {}
            client.chat.completions.create(
                model="gpt-4o-mini",
                max_tokens=30,
                messages=[{"role": "user", "content": f"find where task {i} parses its config"}],
                **kwargs,
            )
        wait_settled(proxy.url)  # copies finish and the recorder writes them
    windows = window_stats(config.record.db, started - 1)
    candidate, primary = windows["vllm"], windows["hosted"]
    assert candidate.requests == 40  # one shadow copy per request
    assert primary.requests == 80  # each answer plus its noise call
    assert candidate.parity_samples == 40
    assert candidate.parity is not None
    assert candidate.parity > 0.8  # same model family, differing only by sampling noise
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvmigrate",
            "report",
            "--format",
            "json",
            "--since",
            "all",
            "--config",
            str(config_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    parity = json.loads(report.stdout)["parity"]
    assert parity["scored"]
    assert parity["noise_pairs"] == 40
    assert parity["noise_adjusted"] == pytest.approx(candidate.parity)


def test_broken_tool_calls_drag_parity_down_and_the_gate_refuses(tmp_path: Path) -> None:
    hosted = BackgroundServer(
        lambda: build_app(
            EmulatorSettings("hosted", time_scale=0, noise=0.2, answer_family="agent")
        )
    )
    broken = BackgroundServer(
        lambda: build_app(
            EmulatorSettings(
                "vllm", time_scale=0, noise=0.2, answer_family="agent", broken_tool_calls=1.0
            )
        )
    )
    with hosted, broken:
        config_path = tmp_path / "config.yaml"
        config_path.write_text(f"""
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{broken.url}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout:
  shadow_sample: 1.0
  noise_sample: 1.0
  noise_per_minute: 1000
  state: "sqlite:///{tmp_path}/state.db"
  gates: {{min_conversations: 5, min_requests: 10, min_parity: 0.9, min_parity_samples: 10}}
record: {{db: "sqlite:///{tmp_path}/records.db"}}
""")
        config = parse_config(config_path.read_text(), env={})
        with (
            BackgroundServer(lambda: build_runtime_app(config)) as proxy,
            openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0) as client,
        ):
            for i in range(30):
                client.chat.completions.create(
                    model="gpt-4o-mini",
                    tools=TOOLS,
                    tool_choice="required",
                    messages=[{"role": "user", "content": f"look up module {i}"}],
                )
            wait_settled(proxy.url)
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvmigrate",
            "rollout",
            "--percent",
            "10",
            "--config",
            str(config_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "parity failed" in refused.stderr


def test_a_null_error_field_is_not_an_error() -> None:
    from kvmigrate.parity import score_exchange_pair

    answer = (
        b'{"id": "resp_1", "object": "response", "status": "completed", "error": null, '
        b'"output": [{"type": "message", "role": "assistant", "content": '
        b'[{"type": "output_text", "text": "hello there"}]}]}'
    )
    pair = score_exchange_pair("responses", b'{"input": "hi"}', answer, 200, answer, 200)
    assert pair.scorable
    assert pair.agree
