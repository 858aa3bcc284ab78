"""Offline and online agree: the live cache-buster detector in a running proxy and
`kvmigrate cachecheck` on the proxy's exported requests count the same breaks on the same
traffic, also when the system prompt changes every turn and no session id is sent (issue 25:
offline used to see each turn of such a conversation as a new 1-turn conversation)."""

from __future__ import annotations

import collections
import io
import json
import time
from pathlib import Path
from typing import Any

import openai
from click.testing import CliRunner

from kvmigrate.cachecheck.addon import CacheBusterAddon
from kvmigrate.cli import main
from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.recorder.export import export_requests
from kvmigrate.recorder.store import open_store
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"


def _agent(client: openai.OpenAI, number: int, turns: int) -> None:
    history: list[Any] = [{"role": "user", "content": f"Summarise report {number} for me."}]
    for turn in range(turns):
        now = time.strftime("%Y-%m-%d %H:%M:%S") + f".{time.time_ns() % 10**6:06d}"
        system = {"role": "system", "content": f"Current time: {now}\nYou are a careful analyst."}
        answer = client.chat.completions.create(
            model=MODEL, messages=[system, *history], max_tokens=16
        )
        history += [answer.choices[0].message, {"role": "user", "content": f"More, {turn}."}]


def test_live_and_offline_detectors_count_the_same_breaks(tmp_path: Path) -> None:
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings("hosted", time_scale=0)))
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings("vllm", time_scale=0)))
    with hosted, vllm:
        config = parse_config(
            f"""
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{vllm.url}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: split, percent: 50, state: "sqlite:///{tmp_path}/state.db"}}
record: {{db: "sqlite:///{tmp_path}/records.db", content: full}}
cachecheck: {{enabled: false}}
""",
            env={},
        )
        live = CacheBusterAddon(worker="thread")
        proxy = BackgroundServer(lambda: build_runtime_app(config, extra_addons=[live]))
        with proxy:
            with openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk", max_retries=0) as c:
                for number in range(4):
                    _agent(c, number, turns=4)
            deadline = time.monotonic() + 20
            while live.processed < 16:
                assert time.monotonic() < deadline, f"live detector checked {live.processed}"
                time.sleep(0.05)
    online = collections.Counter(
        o.check.brk.cls.value for o in live.results if o.check.brk is not None
    )

    store = open_store(config.record.db)
    exported = io.StringIO()
    export_requests(store, 0, time.time() + 1, exported)
    store.close()
    dataset = tmp_path / "export.jsonl"
    dataset.write_text(exported.getvalue())
    result = CliRunner().invoke(main, ["cachecheck", "--dataset", str(dataset), "--json"])
    assert result.exit_code == 2, result.output
    offline_data = json.loads(result.stdout)
    offline = collections.Counter(
        t["break"]["class"]
        for conversation in offline_data["conversations"]
        for t in conversation["turns"]
        if t["break"]
    )
    assert len(offline_data["conversations"]) == 4
    assert online == offline == {"timestamp": 12}  # turns 2-4 of 4 conversations
