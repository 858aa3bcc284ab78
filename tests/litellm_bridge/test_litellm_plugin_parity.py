"""The plugin does what kvmigrate's proxy does, inside a real LiteLLM 1.108.7 proxy: Responses
chains stay where they are stored and their copies continue the candidate's own chain,
Anthropic Messages are keyed, split, copied and recorded, an agent whose system prompt
changes every turn stays one conversation, and cohorts move on their own.

One LiteLLM process (with a master key, so LiteLLM encrypts every Responses id it hands
out) loads the plugin; the official openai and anthropic SDKs talk to it, and each emulator
keeps the bodies it received.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from litellm_support import Emulator, records, wait_for
from openai import OpenAI

from kvmigrate.config import Config, load_config
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.litellm_bridge.plugin import GENERATION_HEADER
from kvmigrate.policies import in_candidate_share
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.testbed.litellm_process import (
    PLUGIN_CALLBACK,
    LiteLLMProxy,
    model_entry,
    write_config,
)

pytestmark = [pytest.mark.litellm, pytest.mark.timeout(900)]

MODEL = "gpt-4o-mini"
CANDIDATE_GROUP = "vllm-llama"
CLAUDE = "claude-haiku"
CLAUDE_CANDIDATE = "vllm-claude"
VLLM_MODEL = "llama-3.1-8b"
BETA = "beta-agents"  # a named cohort of MODEL: requests with `X-Team: beta`
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"


def _anthropic_entry(group: str, model: str, api_base: str) -> dict[str, Any]:
    """A deployment LiteLLM calls with Anthropic's own wire (`/v1/messages`)."""
    params = {"model": f"anthropic/{model}", "api_base": api_base, "api_key": "none"}
    return {"model_name": group, "litellm_params": params}


class Stack:
    def __init__(self, hosted: Emulator, vllm: Emulator, proxy: LiteLLMProxy, path: Path) -> None:
        self.hosted = hosted
        self.vllm = vllm
        self.proxy = proxy
        self.config: Config = load_config(path)
        self.client = OpenAI(
            base_url=proxy.url + "/v1", api_key=proxy.master_key, max_retries=0, timeout=60
        )
        self.claude = anthropic.Anthropic(
            base_url=proxy.url, api_key=proxy.master_key, max_retries=0, timeout=60
        )

    def set_split(self, percent: float, cohort: str = MODEL) -> None:
        controller = open_controller(self.config)
        try:
            controller.set_percent(percent, reason="test", actor="test", force=True, cohort=cohort)
            generation = controller.store.version()
        finally:
            controller.store.close()

        def applied() -> bool:
            raw = self.client.chat.completions.with_raw_response.create(
                model=CANDIDATE_GROUP, messages=[{"role": "user", "content": "probe"}]
            )
            return int(raw.headers.get(GENERATION_HEADER, "0")) >= generation

        wait_for(applied, timeout=30.0, what=f"LiteLLM to route by generation {generation}")

    def rows(self, conversation: str, role: str = "serve") -> list[sqlite3.Row]:
        where = f"conversation = '{conversation}' AND role = '{role}' ORDER BY turn"
        return records(self.config, where)

    def respond(
        self, text: str, previous: str | None, stream: bool, session: str | None = None
    ) -> tuple[str, str | None]:
        """(response id as the client got it, x-kvmigrate-backend) of one Responses turn."""
        headers = {"X-Session-ID": session} if session else {}
        extra: dict[str, Any] = {"previous_response_id": previous} if previous else {}
        create = self.client.responses.with_raw_response.create
        raw = create(model=MODEL, input=text, stream=stream, extra_headers=headers, **extra)
        backend = raw.headers.get("x-kvmigrate-backend")
        if not stream:
            answer = raw.parse()
            assert answer.output_text
            return answer.id, backend
        events = list(raw.parse())
        assert events[-1].type == "response.completed"
        return events[-1].response.id, backend


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("litellm-parity")
    hosted = Emulator(EmulatorSettings(profile="hosted", time_scale=0.0, models=(MODEL, CLAUDE)))
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
  - model_name: {CLAUDE}
    hosted: {CLAUDE}
    vllm: {CLAUDE_CANDIDATE}
cohorts:
  - name: {BETA}
    model: {MODEL}
    match:
      header: {{X-Team: beta}}
rollout:
  primary: hosted
  candidate: vllm
  mode: split
  percent: 50
  noise_sample: 0.0
  state: sqlite:///{root}/state.db
record:
  db: sqlite:///{root}/records.db
  content: full
"""
    )
    litellm_config = write_config(
        root / "litellm.yaml",
        [
            model_entry(MODEL, MODEL, hosted.server.url + "/v1"),
            model_entry(CANDIDATE_GROUP, VLLM_MODEL, vllm.server.url + "/v1"),
            _anthropic_entry(CLAUDE, CLAUDE, hosted.server.url),
            _anthropic_entry(CLAUDE_CANDIDATE, VLLM_MODEL, vllm.server.url),
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
        print(f"LiteLLM exited with {code}; log tail:\n{proxy.log(4000)}")


def _sessions(salt: str, candidate: bool, cohort_percent: float = 50) -> Iterator[str]:
    while True:
        session = "s-" + uuid.uuid4().hex
        if in_candidate_share(salt, session, cohort_percent) == candidate:
            yield session


def _stored_chain(emulator: Emulator, previous_ids: list[str]) -> None:
    """Each id is stored on `emulator` and continues the one before it."""
    client = OpenAI(base_url=emulator.server.url + "/v1", api_key="none", max_retries=0)
    for earlier, later in itertools.pairwise(previous_ids):
        assert client.responses.retrieve(later).previous_response_id == earlier


def _unknown_to(emulator: Emulator, response_id: str) -> None:
    client = OpenAI(base_url=emulator.server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response_id)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_responses_chain_stays_where_it_is_stored_and_its_copies_chain_on_the_candidate(
    stack: Stack, stream: bool
) -> None:
    stack.set_split(50)
    salt = stack.config.rollout.salt
    on_candidate = next(_sessions(salt, candidate=True))
    on_primary = next(_sessions(salt, candidate=False))
    marks = {on_candidate: "mark-" + uuid.uuid4().hex, on_primary: "mark-" + uuid.uuid4().hex}
    last: dict[str, str] = {}
    for session, expected in ((on_candidate, "vllm"), (on_primary, "hosted")):
        # Turn 1 names its conversation; the later turns only the response they continue.
        last[session], backend = stack.respond(f"{marks[session]} turn 1", None, stream, session)
        assert backend == expected
    # The split now sends every new conversation to the primary: the candidate's chain stays.
    stack.set_split(0)
    for turn in (2, 3, 4):
        for session, expected in ((on_candidate, "vllm"), (on_primary, "hosted")):
            text = f"{marks[session]} turn {turn}"
            last[session], backend = stack.respond(text, last[session], stream)
            assert backend == expected, f"turn {turn} of the chain on {expected}"
    # ... and every new conversation to the candidate: the primary's chain stays.
    stack.set_split(100)
    _, backend = stack.respond(f"{marks[on_primary]} turn 5", last[on_primary], stream)
    assert backend == "hosted"

    # The candidate's chain: 4 turns, each continuing its own answer; the primary saw none.
    served = stack.vllm.received(RESPONSES, marks[on_candidate])
    assert [b.get("stream", False) for b in served] == [stream] * 4
    assert stack.hosted.received(RESPONSES, marks[on_candidate]) == []
    chain = [b.get("previous_response_id") for b in served]
    assert chain[0] is None
    assert None not in chain[1:]
    _stored_chain(stack.vllm, chain[1:])

    # The primary's chain: 5 turns on it, each copied (the conversation's pin, made at
    # turn 1, keeps it a shadowed primary conversation at 100%), each copy continuing the
    # candidate's own answer to the copy before.
    primary = [
        b.get("previous_response_id") for b in stack.hosted.received(RESPONSES, marks[on_primary])
    ]
    assert len(primary) == 5
    assert primary[0] is None
    assert None not in primary[1:]
    _stored_chain(stack.hosted, primary[1:])
    with contextlib.suppress(AssertionError):
        wait_for(lambda: len(stack.vllm.received(RESPONSES, marks[on_primary])) >= 5, 30.0)
    copies = [
        b.get("previous_response_id") for b in stack.vllm.received(RESPONSES, marks[on_primary])
    ]
    assert len(copies) == 5, copies
    assert copies[0] is None
    assert None not in copies[1:]
    assert set(copies[1:]).isdisjoint(primary)
    _stored_chain(stack.vllm, copies[1:])
    for own in copies[1:]:
        _unknown_to(stack.hosted, own)

    # Recorded as one conversation each, turn by turn; the copies paired and answered.
    wait_for(lambda: len(stack.rows(on_primary, "shadow")) == 5, what="5 copies recorded")
    wait_for(lambda: len(stack.rows(on_candidate)) == 4, what="the candidate's 4 answers")
    wait_for(lambda: len(stack.rows(on_primary)) == 5, what="the primary's 5 answers")
    assert [(r["turn"], r["backend"]) for r in stack.rows(on_candidate)] == [
        (t, "vllm") for t in (1, 2, 3, 4)
    ]
    assert [(r["turn"], r["backend"]) for r in stack.rows(on_primary)] == [
        (t, "hosted") for t in (1, 2, 3, 4, 5)
    ]
    shadows = stack.rows(on_primary, "shadow")
    assert [(r["turn"], r["status"], r["backend"]) for r in shadows] == [
        (t, 200, "vllm") for t in (1, 2, 3, 4, 5)
    ]
    assert {r["identity"] for r in stack.rows(on_primary)} == {"header", "chain"}


def _rows(stack: Stack, call_ids: list[str], role: str = "serve") -> list[sqlite3.Row]:
    """The records of the calls LiteLLM named (`x-litellm-call-id`): their answers, or the
    copies paired with them."""
    ids = ",".join(f"'llm_{c}'" for c in call_ids)
    column = "request_id" if role == "serve" else "pair_id"
    return records(stack.config, f"role = '{role}' AND {column} IN ({ids}) ORDER BY turn")


def _message_turns(
    stack: Stack, marker: str, metadata: dict[str, str] | None
) -> list[tuple[str | None, str]]:
    """Four turns of one Anthropic Messages conversation, turns 2 and 4 streamed; each
    resends the history. (x-kvmigrate-backend, x-litellm-call-id) of each."""
    history: list[dict[str, Any]] = []
    seen: list[tuple[str | None, str]] = []
    extra: dict[str, Any] = {"metadata": metadata} if metadata else {}
    for turn in (1, 2, 3, 4):
        history.append({"role": "user", "content": f"{marker} question {turn}"})
        create = stack.claude.messages.with_raw_response.create
        stream = turn % 2 == 0
        raw = create(model=CLAUDE, max_tokens=64, messages=history, stream=stream, **extra)
        if stream:
            parts = [
                e.delta.text
                for e in raw.parse()
                if e.type == "content_block_delta" and e.delta.type == "text_delta"
            ]
            text = "".join(parts)
        else:
            text = "".join(b.text for b in raw.parse().content if b.type == "text")
        assert text
        seen.append((raw.headers.get("x-kvmigrate-backend"), raw.headers["x-litellm-call-id"]))
        history.append({"role": "assistant", "content": text})
    return seen


def test_an_anthropic_messages_conversation_stays_on_one_deployment_and_is_recorded(
    stack: Stack,
) -> None:
    stack.set_split(50, cohort=CLAUDE)
    salt = stack.config.rollout.salt
    # Declared by `metadata.user_id`, in the candidate's half; and one that declares nothing,
    # known from the second turn on by the history it resends.
    user = next(
        u
        for u in ("u-" + uuid.uuid4().hex for _ in range(1000))
        if in_candidate_share(salt, "user:" + u, 50)
    )
    declared, undeclared = "mark-" + uuid.uuid4().hex, "mark-" + uuid.uuid4().hex
    turns = _message_turns(stack, declared, {"user_id": user})
    assert {backend for backend, _ in turns} == {"vllm"}
    assert len(stack.vllm.received(MESSAGES, declared)) == 4
    assert stack.hosted.received(MESSAGES, declared) == []
    wait_for(lambda: len(stack.rows("user:" + user)) == 4, what="4 Messages answers recorded")
    rows = stack.rows("user:" + user)
    assert [(r["turn"], r["route"], r["backend"], r["identity"]) for r in rows] == [
        (t, "messages", "vllm", "user") for t in (1, 2, 3, 4)
    ]
    assert [bool(r["stream"]) for r in rows] == [False, True, False, True]
    assert [r["request_id"] for r in rows] == [f"llm_{c}" for _, c in turns]
    assert all(r["status"] == 200 and r["completion_tokens"] for r in rows)

    turns = _message_turns(stack, undeclared, None)
    (backend,) = {backend for backend, _ in turns}
    other = stack.hosted if backend == "vllm" else stack.vllm
    served = stack.vllm if backend == "vllm" else stack.hosted
    assert len(served.received(MESSAGES, undeclared)) == 4
    calls = [c for _, c in turns]
    wait_for(lambda: len(_rows(stack, calls)) == 4, what="4 answers recorded")
    rows = _rows(stack, calls)
    assert len({r["conversation"] for r in rows}) == 1
    assert [(r["turn"], r["identity"]) for r in rows] == [
        (1, "opening"),
        (2, "continuity"),
        (3, "continuity"),
        (4, "continuity"),
    ]
    if backend == "hosted":  # a primary conversation at a split is shadowed, turn by turn
        wait_for(lambda: len(_rows(stack, calls, "shadow")) == 4, what="4 copies")
        copies = _rows(stack, calls, "shadow")
        assert [(r["turn"], r["status"], r["backend"]) for r in copies] == [
            (t, 200, "vllm") for t in (1, 2, 3, 4)
        ]
        assert len(other.received(MESSAGES, undeclared)) == 4
    else:
        assert other.received(MESSAGES, undeclared) == []


def test_a_chat_agent_whose_system_prompt_carries_the_time_stays_on_one_deployment(
    stack: Stack,
) -> None:
    stack.set_split(50)
    backends: list[str] = []
    for _agent in range(4):
        marker = "mark-" + uuid.uuid4().hex
        messages: list[dict[str, Any]] = []
        seen = set()
        calls = []
        for turn in range(4):
            system = {"role": "system", "content": f"You are an agent. Time: 12:0{turn}:{turn}7"}
            messages.append({"role": "user", "content": f"{marker} step {turn}"})
            raw = stack.client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[system, *messages]
            )
            text = raw.parse().choices[0].message.content
            assert text
            seen.add(raw.headers.get("x-kvmigrate-backend"))
            calls.append(raw.headers["x-litellm-call-id"])
            messages.append({"role": "assistant", "content": text})
        assert len(seen) == 1, f"an agent moved between deployments: {seen}"
        backends += seen
        wait_for(lambda c=calls: len(_rows(stack, c)) == 4, what="the agent's 4 turns")
        rows = _rows(stack, calls)
        assert len({r["conversation"] for r in rows}) == 1
        assert [r["identity"] for r in rows] == ["opening"] + ["continuity"] * 3
        served = stack.vllm if seen == {"vllm"} else stack.hosted
        assert len(served.received("/v1/chat/completions", marker)) >= 4


def test_two_cohorts_move_independently(stack: Stack) -> None:
    stack.set_split(0)
    stack.set_split(100, cohort=BETA)

    def backend(session: str, team: str | None) -> str | None:
        headers = {"X-Session-ID": session, **({"X-Team": team} if team else {})}
        raw = stack.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_headers=headers
        )
        assert raw.parse().choices[0].message.content
        return raw.headers.get("x-kvmigrate-backend")

    sessions = ["s-" + uuid.uuid4().hex for _ in range(6)]
    assert [backend(s, "beta") for s in sessions] == ["vllm"] * 6
    assert [backend(s + "-x", None) for s in sessions] == ["hosted"] * 6
    stack.set_split(0, cohort=BETA)
    stack.set_split(100)
    fresh = ["s-" + uuid.uuid4().hex for _ in range(6)]
    assert [backend(s, "beta") for s in fresh] == ["hosted"] * 6
    assert [backend(s + "-x", None) for s in fresh] == ["vllm"] * 6
    wait_for(lambda: records(stack.config, f"conversation = '{fresh[0]}'") != [], what="record")
    beta = records(stack.config, f"conversation = '{fresh[0]}'")
    assert {r["cohort"] for r in beta} == {BETA}
