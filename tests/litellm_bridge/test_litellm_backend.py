"""A `type: litellm` primary in kvmigrate's own proxy, through litellm's OpenAI provider.

One `kvmigrate proxy` process, run by the LiteLLM venv's python (started once for the
module, ~6 s, most of it importing litellm), in front of two emulators: the hosted one is
reached through litellm with the model string `openai/gpt-4o-mini` and a configured key,
the vLLM one directly. The openai SDK is the client.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from litellm_support import (
    Emulator,
    KvmigrateProxy,
    records,
    set_shadow,
    set_split,
    shadow_rollout,
    wait_for,
)

from kvmigrate.config import Config, load_config
from kvmigrate.emulator.settings import EmulatorSettings

pytestmark = [pytest.mark.litellm, pytest.mark.timeout(600)]

MODEL = "gpt-4o-mini"
EMBEDDING_MODEL = "text-embedding-3-small"
VLLM_MODEL = "llama-3.1-8b"
HOSTED_KEY = "sk-hosted-from-config"
CLIENT_KEY = "sk-client-must-stay-here"
KEY_ENV = "KVMIGRATE_TEST_HOSTED_KEY"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class Stack:
    def __init__(self, hosted: Emulator, vllm: Emulator, proxy: KvmigrateProxy, config: Config):
        self.hosted = hosted
        self.vllm = vllm
        self.proxy = proxy
        self.config = config
        self.client = openai.OpenAI(
            base_url=proxy.url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
        )

    def chat(self, text: str = "hello", **extra: Any) -> tuple[str | None, Any]:
        """(x-kvmigrate-backend, the answer) of one non-streamed chat turn."""
        raw = self.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": text}], **extra
        )
        return raw.headers.get("x-kvmigrate-backend"), raw.parse()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("litellm-backend")
    hosted = Emulator(EmulatorSettings(profile="hosted", time_scale=0.0, api_key=HOSTED_KEY))
    vllm = Emulator(EmulatorSettings(profile="vllm", time_scale=0.0, models=(VLLM_MODEL,)))
    hosted.server.start()
    vllm.server.start()
    config_path = root / "kvmigrate.yaml"
    config_path.write_text(_config_text(hosted.server.url, vllm.server.url, root))
    proxy = KvmigrateProxy(config_path, extra_env={KEY_ENV: HOSTED_KEY})
    try:
        proxy.start()
        yield Stack(hosted, vllm, proxy, load_config(config_path, env={KEY_ENV: HOSTED_KEY}))
    finally:
        code = proxy.stop()
        hosted.server.stop()
        vllm.server.stop()
        print(f"kvmigrate proxy exited with {code}; log tail:\n{proxy.log(3000)}")


def _config_text(hosted_url: str, vllm_url: str, root: Path) -> str:
    return f"""
backends:
  hosted:
    type: litellm
    api_base: {hosted_url}/v1
    api_key: os.environ/{KEY_ENV}
    litellm_params: {{max_retries: 0}}  # a fault reaches the client at once
  vllm:
    api_base: {vllm_url}/v1
models:
  - {{model_name: {MODEL}, hosted: openai/{MODEL}, vllm: {VLLM_MODEL}}}
  - {{model_name: {EMBEDDING_MODEL}, hosted: openai/{EMBEDDING_MODEL}}}
{shadow_rollout(root)}"""


def _session() -> dict[str, str]:
    return {"X-Session-ID": "s-" + uuid.uuid4().hex}


@pytest.mark.slow
def test_chat_streamed_and_not_through_litellm(stack: Stack) -> None:
    set_shadow(stack.config)
    messages = [{"role": "user", "content": "tell me about prefix caching"}]
    whole = stack.client.chat.completions.create(model=MODEL, messages=messages, seed=7)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.content
    assert whole.usage is not None
    assert whole.usage.completion_tokens > 0
    chunks = list(
        stack.client.chat.completions.create(
            model=MODEL,
            messages=messages,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3
    assert text == whole.choices[0].message.content  # the same seeded answer, in pieces
    assert chunks[-1].choices == []  # OpenAI's usage chunk, not litellm's empty choice
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "provider_specific_fields" not in json.dumps(whole.model_dump())


def test_tool_calls_survive(stack: Stack) -> None:
    backend, answer = stack.chat("What is the weather in Paris?", tools=[WEATHER])
    assert backend == "hosted"
    call = answer.choices[0].message.tool_calls[0]
    assert answer.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(
        stack.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER],
            stream=True,
        )
    )
    deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert deltas
    assert deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == {"city": "Paris"}


def test_embeddings_and_responses(stack: Stack) -> None:
    vectors = stack.client.embeddings.create(model=EMBEDDING_MODEL, input=["one", "two"])
    assert [len(v.embedding) for v in vectors.data] == [1536, 1536]
    response = stack.client.responses.create(model=MODEL, input="hi there")
    assert response.output_text
    events = list(stack.client.responses.create(model=MODEL, input="hi, streamed", stream=True))
    assert events[-1].type == "response.completed"
    models = {m.id for m in stack.client.models.list()}
    assert models == {MODEL, EMBEDDING_MODEL}


def test_shadow_records_the_primary_and_its_copy_with_parity(stack: Stack) -> None:
    set_shadow(stack.config)
    headers = _session()
    session = headers["X-Session-ID"]
    backend, answer = stack.chat("hello there", extra_headers=headers)
    assert backend == "hosted"
    assert answer.choices[0].message.content
    chunks = stack.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello there"}],
        stream=True,
        extra_headers=headers,
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    where = f"conversation = '{session}'"
    wait_for(lambda: len(records(stack.config, where)) == 4, what="2 answers and 2 copies")
    rows = records(stack.config, where)
    serves = {r["request_id"]: r for r in rows if r["role"] == "serve"}
    assert {(r["backend"], r["served_model"]) for r in serves.values()} == {
        ("hosted", f"openai/{MODEL}")
    }
    for shadow in (r for r in rows if r["role"] == "shadow"):
        primary = serves[shadow["pair_id"]]
        assert (shadow["backend"], shadow["status"]) == ("vllm", 200)
        assert shadow["stream"] == primary["stream"]
        assert shadow["parity_kind"] == "candidate"
        assert shadow["parity_score"] is not None
    for primary in serves.values():
        assert primary["status"] == 200
        assert (primary["ttft_ms"] is not None) == bool(primary["stream"])
        if not primary["stream"]:  # a stream has usage only when the client asks for it
            assert primary["completion_tokens"]


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [("429", openai.RateLimitError, 429), ("503", openai.InternalServerError, 503)],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_primary_fault_is_an_openai_error_with_its_status(
    stack: Stack, fault: str, error: type[openai.APIStatusError], status: int, stream: bool
) -> None:
    set_shadow(stack.config)
    before = stack.hosted.total()
    stack.hosted.fault = fault
    try:
        with pytest.raises(error) as caught:
            stack.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=stream
            )
    finally:
        stack.hosted.fault = None
    assert caught.value.status_code == status
    body = caught.value.body
    assert isinstance(body, dict)  # the SDK unwraps {"error": {...}}
    assert body["message"]
    assert "Traceback" not in body["message"]
    assert caught.value.response.headers["x-kvmigrate-backend"] == "hosted"
    if status == 429:  # the emulator's Retry-After, relayed by litellm's exception
        assert caught.value.response.headers["retry-after"] == "1"
    assert stack.hosted.total() - before == 1  # litellm_params.max_retries reached litellm


def test_only_the_configured_key_reaches_the_hosted_api(stack: Stack) -> None:
    stack.chat()
    assert stack.hosted.headers
    assert {h.get("Authorization") for h in stack.hosted.headers} == {f"Bearer {HOSTED_KEY}"}
    for seen in stack.hosted.headers + stack.vllm.headers:
        assert CLIENT_KEY not in json.dumps(seen)


def test_split_at_100_percent_serves_from_the_candidate(stack: Stack) -> None:
    set_split(stack.config, 100)
    try:
        wait_for(
            lambda: stack.chat(extra_headers=_session())[0] == "vllm",
            what="the proxy to follow the split",
        )
        before_hosted, before_vllm = stack.hosted.total(), stack.vllm.total()
        for _ in range(3):
            backend, answer = stack.chat(extra_headers=_session())
            assert backend == "vllm"
            assert answer.model == VLLM_MODEL
        assert stack.vllm.total() - before_vllm == 3
        assert stack.hosted.total() == before_hosted
    finally:
        set_shadow(stack.config)
