"""The plugin inside a real LiteLLM proxy where LiteLLM retries or falls back, and where a
client's body carries LiteLLM's own settings: what is recorded, what is copied, what the
client is told. kvmigrate's own proxy is the reference for each behaviour.

One LiteLLM process (started once for the module) loads the plugin; the candidate
emulator has a context window of 100 tokens, smaller than the hosted one, and either
emulator can be told to fail its next requests.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from litellm_support import Emulator, records, set_shadow, set_split, shadow_rollout, wait_for
from openai import OpenAI

from kvmigrate.config import Config, load_config
from kvmigrate.emulator.faults import FAULT_HEADER
from kvmigrate.emulator.server import build_app
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.litellm_bridge.plugin import GENERATION_HEADER
from kvmigrate.testbed.litellm_process import (
    FIRST_PLUGIN_CALLBACK,
    LiteLLMProxy,
    model_entry,
    write_config,
)

pytestmark = [pytest.mark.litellm, pytest.mark.timeout(600)]

MODEL = "gpt-4o-mini"
CANDIDATE_GROUP = "vllm-llama"
VLLM_MODEL = "llama-3.1-8b"
HOSTED_KEY = "sk-hosted-from-litellm-config"
CLIENT_SECRET = "sk-client-own-hosted-key"


class FaultingEmulator(Emulator):
    """An emulator that fails the next requests with the faults queued in `next_faults`."""

    def __init__(self, settings: EmulatorSettings) -> None:
        self.next_faults: list[str] = []
        super().__init__(settings)

    def _app(self) -> web.Application:
        app = build_app(self.settings)

        @web.middleware
        async def observe(request: web.Request, handler: Any) -> web.StreamResponse:
            self.counts[request.path] += 1
            self.headers.append(dict(request.headers))
            fault = self.next_faults.pop(0) if self.next_faults else self.fault
            if fault is not None:
                request = request.clone(headers={**request.headers, FAULT_HEADER: fault})
            response: web.StreamResponse = await handler(request)
            return response

        app.middlewares.insert(0, observe)
        return app


class Stack:
    def __init__(
        self, hosted: FaultingEmulator, vllm: FaultingEmulator, proxy: LiteLLMProxy, path: Path
    ) -> None:
        self.hosted = hosted
        self.vllm = vllm
        self.proxy = proxy
        self.config: Config = load_config(path)
        self.client = OpenAI(
            base_url=proxy.url + "/v1", api_key=proxy.master_key, max_retries=0, timeout=60
        )

    def apply(self, generation: int) -> None:
        def applied() -> bool:
            raw = self.client.chat.completions.with_raw_response.create(
                model=CANDIDATE_GROUP, messages=[{"role": "user", "content": "probe"}]
            )
            return int(raw.headers.get(GENERATION_HEADER, "0")) >= generation

        wait_for(applied, timeout=30.0, what=f"LiteLLM to route by generation {generation}")

    def chat(self, session: str, text: str = "hello", **extra: Any) -> str | None:
        raw = self.client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": text}],
            extra_headers={"X-Session-ID": session},
            **extra,
        )
        assert raw.parse().choices[0].message.content
        return raw.headers.get("x-kvmigrate-backend")

    def rows(self, session: str) -> list[sqlite3.Row]:
        return records(self.config, f"conversation = '{session}'")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("litellm-probe")
    hosted = FaultingEmulator(EmulatorSettings(profile="hosted", time_scale=0.0))
    vllm = FaultingEmulator(
        EmulatorSettings(profile="vllm", time_scale=0.0, models=(VLLM_MODEL,), max_model_len=100)
    )
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
            model_entry(MODEL, MODEL, hosted.server.url + "/v1", api_key=HOSTED_KEY),
            model_entry(CANDIDATE_GROUP, VLLM_MODEL, vllm.server.url + "/v1"),
        ],
        # The plugin's first path, as LiteLLM configs written before it moved name it: it
        # loads the same plugin (the other files load it by its own path).
        callbacks=[FIRST_PLUGIN_CALLBACK],
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


def _outcomes(rows: list[sqlite3.Row]) -> list[tuple[str, str, int | None, str | None]]:
    return sorted((r["role"], r["backend"], r["status"], r["fallback_from"]) for r in rows)


@pytest.mark.slow
def test_a_candidate_refusal_falls_back_and_is_recorded_as_rejected(stack: Stack) -> None:
    """kvmigrate's proxy: a candidate's 4xx (here its smaller context window) falls back to
    the primary, which answers; the candidate's refusal is recorded as `rejected` (its
    error), the primary's answer as served with `fallback_from`."""
    stack.apply(set_split(stack.config, 100))
    session = _session()
    assert stack.chat(session, text="word " * 200) == "hosted"
    wait_for(lambda: len(stack.rows(session)) == 2, what="the refusal and the answer")
    rows = stack.rows(session)
    assert _outcomes(rows) == [("serve", "hosted", 200, "vllm"), ("serve", "vllm", 400, None)]
    refusal = next(r for r in rows if r["backend"] == "vllm")
    assert refusal["error"] == "rejected"
    assert len({r["request_id"] for r in rows}) == 2


@pytest.mark.slow
def test_a_failing_candidate_falls_back_and_the_answer_is_recorded(stack: Stack) -> None:
    stack.apply(set_split(stack.config, 100))
    session = _session()
    stack.vllm.fault = "503"
    try:
        assert stack.chat(session) == "hosted"
    finally:
        stack.vllm.fault = None
    wait_for(
        lambda: ("serve", "hosted", 200, "vllm") in _outcomes(stack.rows(session)),
        what="the primary's answer after the fallback",
    )
    failed = [r for r in stack.rows(session) if r["backend"] == "vllm"]
    assert failed
    assert {(r["status"], r["error"]) for r in failed} == {(503, "http_503")}


def test_a_primary_answer_after_litellm_retried_is_recorded_and_copied_once(
    stack: Stack,
) -> None:
    """LiteLLM retries the primary's 503 itself: the client gets the retry's answer, and
    that answer is recorded and shadowed, once; the failed attempt is recorded, never copied
    (kvmigrate's proxy shadows no 5xx)."""
    stack.apply(set_shadow(stack.config))
    session = _session()
    before = stack.vllm.total()
    stack.hosted.next_faults = ["503"]
    assert stack.chat(session) == "hosted"
    wait_for(lambda: len(stack.rows(session)) == 3, what="the attempt, the answer, one copy")
    rows = stack.rows(session)
    assert _outcomes(rows) == [
        ("serve", "hosted", 200, None),
        ("serve", "hosted", 503, None),
        ("shadow", "vllm", 200, None),
    ]
    answer = next(r for r in rows if r["role"] == "serve" and r["status"] == 200)
    copy = next(r for r in rows if r["role"] == "shadow")
    assert copy["pair_id"] == answer["request_id"]
    assert stack.vllm.total() - before == 1


@pytest.mark.parametrize(
    ("primary_fault", "copy_error"),
    [
        (None, "rejected"),  # the primary answered: the candidate's refusal is its own
        ("400", "http_400"),  # the primary refused too: the request's fault, not evidence
    ],
)
def test_a_candidate_refusing_a_copy_is_judged_by_the_primarys_answer(
    stack: Stack, primary_fault: str | None, copy_error: str
) -> None:
    """kvmigrate's proxy judges a shadow copy's 4xx as split mode judges one (here the
    candidate's context window is too small for the prompt): `rejected`, against the
    candidate, where the primary answered. As `http_400` it read as the client's fault."""
    stack.apply(set_shadow(stack.config))
    session = _session()
    stack.hosted.next_faults = [primary_fault] if primary_fault else []
    if primary_fault:
        with pytest.raises(Exception, match=primary_fault):
            stack.chat(session, text="word " * 200)
    else:
        assert stack.chat(session, text="word " * 200) == "hosted"
    wait_for(lambda: len(stack.rows(session)) == 2, what="the primary's record and its copy")
    copy = next(r for r in stack.rows(session) if r["role"] == "shadow")
    assert (copy["backend"], copy["status"], copy["error"]) == ("vllm", 400, copy_error)


def test_a_request_the_primary_failed_gets_no_copy(stack: Stack) -> None:
    stack.apply(set_shadow(stack.config))
    session = _session()
    before = stack.vllm.total()
    stack.hosted.fault = "503"
    try:
        with pytest.raises(Exception, match="503"):
            stack.chat(session)
    finally:
        stack.hosted.fault = None
    wait_for(lambda: len(stack.rows(session)) >= 1, what="the failed attempts recorded")
    # A copy would be dispatched with the failure's record: let one more chat and its copy
    # pass, then only that chat's copy has reached the candidate.
    later = _session()
    stack.chat(later)
    wait_for(lambda: len(stack.rows(later)) == 2, what="the later chat and its copy")
    assert {(r["role"], r["status"]) for r in stack.rows(session)} == {("serve", 503)}
    assert stack.vllm.total() - before == 1


def test_a_clients_litellm_settings_never_reach_the_candidate_or_the_records(
    stack: Stack,
) -> None:
    """LiteLLM honours `extra_headers` in a client's body for the group it calls; the
    client's key meant for the hosted API must not ride along on the candidate's copy."""
    stack.apply(set_shadow(stack.config))
    session = _session()
    seen = len(stack.vllm.headers)
    stack.chat(session, extra_body={"extra_headers": {"x-client-key": CLIENT_SECRET}})
    wait_for(lambda: len(stack.rows(session)) == 2, what="the answer and its copy")
    assert CLIENT_SECRET not in json.dumps(stack.vllm.headers[seen:])
    for row in stack.rows(session):
        assert CLIENT_SECRET not in json.dumps(dict(row), default=str)
