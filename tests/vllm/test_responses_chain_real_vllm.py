"""A Responses API chain through the proxy with the real vLLM as the candidate (issue 17):
4 turns by `previous_response_id`, in shadow mode and at a 50% split, streamed and not. The
candidate's shadowed chain must use its own ids (vLLM answers 404 for an id it never issued)
and reuse its prefix cache as the chain grows; every chain stays on one backend; the records
count turns 1-4. The test bed's vLLM runs with VLLM_ENABLE_RESPONSES_API_STORE=1.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from settling import wait_settled

from kvmigrate.config import Config, parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.recorder.store import open_store as open_record_store
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer
from kvmigrate.testbed.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

MODEL = "gpt-4o-mini"
TURNS = 4
TEXT = "the agent opens the repository reads the failing test and proposes a patch"
WORDS = TEXT.split(" ")


@pytest.fixture(scope="module")
def hosted() -> Iterator[BackgroundServer]:
    with BackgroundServer(lambda: build_app(EmulatorSettings("hosted", time_scale=0))) as server:
        yield server


def config_for(tmp_path: Path, hosted: BackgroundServer, vllm: VllmServer, rollout: str) -> Config:
    return parse_config(
        f"""
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{vllm.base_url}", read_timeout: 120}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: tiny}}
rollout: {{{rollout}, state: "sqlite:///{tmp_path}/state.db"}}
record: {{db: "sqlite:///{tmp_path}/records.db", content: full}}
""",
        env={},
    )


NAMES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


def run_chain(client: openai.OpenAI, stream: bool, name: str = "alpha") -> None:
    # Long, unique instructions: many KV blocks to reuse, none cached by an earlier test
    # (the uuid; ids are masked out of conversation keys, so the name tells chains apart).
    instructions = f"Session {uuid.uuid4().hex}. " + " ".join(
        WORDS[i % len(WORDS)] for i in range(300)
    )
    previous: str | None = None
    for turn in range(1, TURNS + 1):
        extra: dict[str, Any] = {"previous_response_id": previous} if previous else {}
        request: dict[str, Any] = {
            "model": MODEL,
            "instructions": instructions,
            "input": f"Chain {name}: next step {turn}?",
            "max_output_tokens": 16,
            **extra,
        }
        if stream:
            events = list(client.responses.create(stream=True, **request))
            final = [e for e in events if e.type in ("response.completed", "response.incomplete")]
            assert len(final) == 1
            previous = final[0].response.id
        else:
            previous = client.responses.create(**request).id


def rows_by_role(config: Config) -> dict[str, dict[str, list[tuple[int, str, int, int]]]]:
    store = open_record_store(config.record.db)
    try:
        rows = store.query(
            "SELECT role, conversation, turn, backend, status, cached_tokens FROM records "
            "WHERE route = 'responses'",
            (),
        )
    finally:
        store.close()
    grouped: dict[str, dict[str, list[tuple[int, str, int, int]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for role, conversation, turn, backend, status, cached in rows:
        grouped[str(role)][str(conversation)].append(
            (int(turn), str(backend), int(status or 0), int(cached or 0))
        )
    return {role: {k: sorted(v) for k, v in chains.items()} for role, chains in grouped.items()}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_shadow_copies_continue_vllms_own_chain_and_hit_its_cache(
    tmp_path: Path, hosted: BackgroundServer, real_vllm: VllmServer, stream: bool
) -> None:
    config = config_for(tmp_path, hosted, real_vllm, "mode: shadow")
    proxy = BackgroundServer(lambda: build_runtime_app(config)).start()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)
    run_chain(client, stream)
    client.close()
    # The copies run one after another (each continues the previous copy's id) on a CPU
    # vLLM, long after the instant primary answered: a stop cancels what is still running
    # after a 1 s grace. Wait for the proxy's own count instead (seconds quiet; the
    # deadline only catches a hang).
    wait_settled(proxy.url, timeout=240)
    proxy.stop()  # flushes the recorder
    grouped = rows_by_role(config)
    [served] = grouped["serve"].values()
    assert [(t, b, s) for t, b, s, _ in served] == [(t, "hosted", 200) for t in (1, 2, 3, 4)]
    [copies] = grouped["shadow"].values()
    assert [(t, b, s) for t, b, s, _ in copies] == [(t, "vllm", 200) for t in (1, 2, 3, 4)]
    cached = [c for *_, c in copies]
    assert cached[0] == 0
    assert 0 < cached[1] < cached[3], cached


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_split_keeps_each_chain_on_one_backend(
    tmp_path: Path, hosted: BackgroundServer, real_vllm: VllmServer, stream: bool
) -> None:
    config = config_for(tmp_path, hosted, real_vllm, "mode: split, percent: 50, shadow_sample: 0")
    proxy = BackgroundServer(lambda: build_runtime_app(config)).start()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)
    for name in NAMES:
        run_chain(client, stream, name)
    client.close()
    proxy.stop()
    served = rows_by_role(config)["serve"]
    assert len(served) == len(NAMES)
    for conversation, turns in served.items():
        assert [t for t, *_ in turns] == [1, 2, 3, 4], conversation
        assert {s for _, _, s, _ in turns} == {200}
        assert len({b for _, b, _, _ in turns}) == 1, (conversation, turns)
    on_vllm = [turns for turns in served.values() if turns[0][1] == "vllm"]
    for turns in on_vllm:
        assert turns[-1][3] > 0, turns  # vLLM reused the chain's prefix
