"""The kvmigrate plugin inside a real LiteLLM proxy process, in front of two emulators.

One LiteLLM process (started once for the module, ~10 s) loads the plugin from its
config.yaml; the openai SDK talks to it. Which emulator answered is read from request
counters the test keeps on each emulator (LiteLLM rewrites the answer's `model` to the
client's model name) and from the plugin's `x-kvmigrate-backend` response header.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litellm_support import Emulator, records, set_shadow, set_split, shadow_rollout, wait_for
from openai import OpenAI

from kvmigrate.config import Config, load_config
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.litellm_bridge.plugin import GENERATION_HEADER
from kvmigrate.policies import in_candidate_share
from kvmigrate.testbed.litellm_process import (
    PLUGIN_CALLBACK,
    LiteLLMProxy,
    model_entry,
    write_config,
)

pytestmark = [pytest.mark.litellm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
MODEL = "gpt-4o-mini"  # what clients send; also the primary's LiteLLM model group
CANDIDATE_GROUP = "vllm-llama"
VLLM_MODEL = "llama-3.1-8b"


class Stack:
    def __init__(
        self, hosted: Emulator, vllm: Emulator, proxy: LiteLLMProxy, config_path: Path
    ) -> None:
        self.hosted = hosted
        self.vllm = vllm
        self.proxy = proxy
        self.config_path = config_path
        self.config: Config = load_config(config_path)
        self.client = OpenAI(
            base_url=proxy.url + "/v1", api_key=proxy.master_key, max_retries=0, timeout=30
        )

    def set_split(self, percent: float) -> None:
        self.wait_applied(set_split(self.config, percent))

    def set_shadow(self) -> None:
        self.wait_applied(set_shadow(self.config))

    def wait_applied(self, generation: int) -> None:
        """Until LiteLLM routes by the store's `generation` or a later one. The probe asks
        for a model group the kvmigrate config does not map: LiteLLM serves it directly
        (one request to the candidate emulator), nothing is routed, copied or recorded."""

        def applied() -> bool:
            raw = self.client.chat.completions.with_raw_response.create(
                model=CANDIDATE_GROUP, messages=[{"role": "user", "content": "probe"}]
            )
            return int(raw.headers.get(GENERATION_HEADER, "0")) >= generation

        wait_for(applied, timeout=30.0, what=f"LiteLLM to route by generation {generation}")

    def records(self, where: str = "1=1") -> list[sqlite3.Row]:
        return records(self.config, where)

    def chat(self, session: str, text: str = "hello", **extra: Any) -> tuple[str | None, str]:
        """(x-kvmigrate-backend, answer text) of one non-streamed chat turn."""
        raw = self.client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": text}],
            extra_headers={"X-Session-ID": session},
            **extra,
        )
        answer = raw.parse()
        return raw.headers.get("x-kvmigrate-backend"), answer.choices[0].message.content or ""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("litellm")
    hosted = Emulator(EmulatorSettings(profile="hosted", time_scale=0.0))
    vllm = Emulator(EmulatorSettings(profile="vllm", time_scale=0.0, models=(VLLM_MODEL,)))
    hosted.server.start()
    vllm.server.start()
    kv_config = root / "kvmigrate.yaml"
    kv_config.write_text(
        f"""
backends:
  hosted:
    api_base: {hosted.server.url}/v1
  vllm:
    api_base: {vllm.server.url}/v1
models:
  - model_name: {MODEL}
    hosted: {MODEL}
    vllm: {CANDIDATE_GROUP}
{shadow_rollout(root)}"""
    )
    litellm_config = write_config(
        root / "litellm.yaml",
        [
            model_entry(MODEL, MODEL, hosted.server.url + "/v1"),
            model_entry(CANDIDATE_GROUP, VLLM_MODEL, vllm.server.url + "/v1"),
        ],
        callbacks=[PLUGIN_CALLBACK],
    )
    proxy = LiteLLMProxy(litellm_config, kvmigrate_config=kv_config)
    try:
        proxy.start()
        yield Stack(hosted, vllm, proxy, kv_config)
    finally:
        code = proxy.stop()
        hosted.server.stop()
        vllm.server.stop()
        print(f"LiteLLM exited with {code}; log tail:\n{proxy.log(3000)}")


def _session() -> str:
    return "s-" + uuid.uuid4().hex


@pytest.mark.slow
def test_split_at_100_percent_serves_from_the_candidate(stack: Stack) -> None:
    stack.set_split(100)
    before_h, before_v = stack.hosted.total(), stack.vllm.total()
    for _ in range(3):
        backend, text = stack.chat(_session())
        assert backend == "vllm"
        assert text
    assert stack.vllm.total() - before_v == 3
    assert stack.hosted.total() == before_h


@pytest.mark.slow
def test_split_at_0_percent_serves_from_the_primary(stack: Stack) -> None:
    stack.set_split(0)
    sessions = [_session() for _ in range(3)]
    where = "conversation IN ({})".format(",".join(f"'{s}'" for s in sessions))
    before_h, before_v = stack.hosted.total(), stack.vllm.total()
    for session in sessions:
        backend, _text = stack.chat(session)
        assert backend == "hosted"
    assert stack.hosted.total() - before_h == 3
    # Split mode keeps shadowing the primary's conversations (evidence for the next step):
    # the candidate receives those copies and nothing else.
    wait_for(lambda: len(stack.records(where)) == 6, what="3 answers and 3 copies recorded")
    assert {(r["role"], r["backend"]) for r in stack.records(where)} == {
        ("serve", "hosted"),
        ("shadow", "vllm"),
    }
    assert stack.vllm.total() - before_v == 3


# The plugin polls the store every 0.25 s and a chat through LiteLLM takes about 0.1 s on a
# quiet machine: a change shows within 0.35 s, and 3.5 s is a 10x margin.
PICKUP_BOUND_S = 3.5


def test_kvmigrate_rollout_cli_steers_litellm_within_its_poll_bound(stack: Stack) -> None:
    stack.set_split(0)
    salt = stack.config.rollout.salt
    # Fresh conversations the 50% split puts on the candidate (every conversation seen at
    # 0% is pinned to the primary, so each probe uses a new one).
    probes = (s for s in (_session() for _ in range(10_000)) if in_candidate_share(salt, s, 50))
    command = [sys.executable, "-m", "kvmigrate", "rollout", "--percent", "50", "--force"]
    command += ["--config", str(stack.config_path)]
    subprocess.run(command, check=True, cwd=REPO, capture_output=True)
    changed = time.monotonic()
    while stack.chat(next(probes))[0] != "vllm":
        assert time.monotonic() - changed < PICKUP_BOUND_S, "LiteLLM did not follow the rollout"
    # Now every new conversation lands as the monotone split says, and stays there.
    sessions = [_session() for _ in range(20)]
    for session in sessions:
        expected = "vllm" if in_candidate_share(salt, session, 50) else "hosted"
        assert stack.chat(session)[0] == expected
        assert stack.chat(session, text="second turn")[0] == expected


def test_shadow_mode_copies_chat_and_responses_streamed_or_not(stack: Stack) -> None:
    stack.set_shadow()
    before = Counter(stack.vllm.counts)
    session = _session()
    headers = {"X-Session-ID": session}
    backend, text = stack.chat(session)
    assert backend == "hosted"
    assert text
    stream = stack.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        extra_headers=headers,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed
    response = stack.client.responses.create(model=MODEL, input="hi there", extra_headers=headers)
    assert response.output_text
    events = list(
        stack.client.responses.create(
            model=MODEL, input="hi, streamed", stream=True, extra_headers=headers
        )
    )
    assert events[-1].type == "response.completed"

    def copies(path: str) -> int:
        return stack.vllm.counts[path] - before[path]

    wait_for(
        lambda: copies("/v1/chat/completions") == 2 and copies("/v1/responses") == 2,
        what="the candidate to receive 4 shadow copies",
    )

    def recorded() -> list[sqlite3.Row]:
        return stack.records(f"conversation = '{session}'")

    wait_for(lambda: len(recorded()) == 8, what="8 records (4 answers, 4 copies)")
    rows = recorded()
    serves = {r["request_id"]: r for r in rows if r["role"] == "serve"}
    shadows = [r for r in rows if r["role"] == "shadow"]
    assert {r["backend"] for r in serves.values()} == {"hosted"}
    assert {(r["route"], bool(r["stream"])) for r in serves.values()} == {
        ("chat/completions", False),
        ("chat/completions", True),
        ("responses", False),
        ("responses", True),
    }
    for shadow in shadows:
        primary = serves[shadow["pair_id"]]
        assert shadow["backend"] == "vllm"
        assert shadow["served_model"] == CANDIDATE_GROUP
        assert (shadow["route"], shadow["stream"]) == (primary["route"], primary["stream"])
        assert shadow["status"] == 200
        assert shadow["parity_kind"] == "candidate"
        assert shadow["parity_score"] is not None
        # TTFT is a streamed answer's figure; a whole answer has only a latency.
        assert (shadow["ttft_ms"] is not None) == bool(shadow["stream"])
        assert shadow["latency_ms"] is not None
    for primary in serves.values():
        assert primary["status"] == 200
        assert (primary["ttft_ms"] is not None) == bool(primary["stream"])
        assert primary["latency_ms"] >= (primary["ttft_ms"] or 0)
        assert primary["completion_tokens"]


def test_models_the_kvmigrate_config_does_not_map_pass_through(stack: Stack) -> None:
    before_v = stack.vllm.total()
    answer = stack.client.chat.completions.create(
        model=CANDIDATE_GROUP, messages=[{"role": "user", "content": "direct"}]
    )
    assert answer.choices[0].message.content
    assert stack.vllm.total() == before_v + 1


def test_kvmigrate_report_counts_litellm_traffic(stack: Stack) -> None:
    wait_for(lambda: len(stack.records("role = 'shadow'")) >= 4, what="shadow records")
    command = [sys.executable, "-m", "kvmigrate", "report", "--format", "json", "--since", "all"]
    command += ["--config", str(stack.config_path)]
    result = subprocess.run(command, check=True, cwd=REPO, capture_output=True, text=True)
    report = json.loads(result.stdout)
    assert report["records"] == len(stack.records())
    by_backend = {b["backend"]: b for b in report["backends"]}
    assert by_backend["hosted"]["serve"] >= 4
    assert by_backend["vllm"]["shadow"] >= 4
    assert report["parity"]["samples"] >= 4
