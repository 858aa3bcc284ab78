"""The real vLLM test bed behaves the way the proxy and the benchmark rely on.

Everything goes straight to vLLM with the official openai SDK, so these tests pin down
vLLM's own behaviour (prefix-cache usage, streamed usage, error envelopes) on this build.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from kvmigrate.testbed.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

BLOCK = 32  # --block-size: cached token counts come in whole blocks
TEXT = "the agent reads the file then calls a tool and writes a short reply to the user"
WORDS = TEXT.split()


@pytest.fixture(scope="module")
def client(real_vllm: VllmServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=real_vllm.base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


def first_turn(words: int = 400) -> list[ChatCompletionMessageParam]:
    """A conversation opening no other test shares (the nonce comes first), of many blocks."""
    nonce = uuid.uuid4().hex
    text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return [
        {"role": "system", "content": f"Session {nonce}. You are a terse coding agent."},
        {"role": "user", "content": text},
    ]


def cached_tokens(usage: openai.types.CompletionUsage | None) -> int:
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None
    return usage.prompt_tokens_details.cached_tokens


def test_second_turn_reuses_the_first_turns_prefix(client: openai.OpenAI) -> None:
    messages = first_turn()
    turn1 = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    assert turn1.usage is not None
    assert turn1.usage.prompt_tokens > 4 * BLOCK
    assert cached_tokens(turn1.usage) == 0

    reply = turn1.choices[0].message.content or ""
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
    turn2 = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)

    cached = cached_tokens(turn2.usage)
    assert cached >= 4 * BLOCK
    assert cached % BLOCK == 0
    assert turn2.usage is not None
    assert cached < turn2.usage.prompt_tokens


def test_stream_ends_with_a_usage_chunk_carrying_cached_tokens(client: openai.OpenAI) -> None:
    messages = first_turn()
    client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)  # warm it

    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        chunks = list(stream)

    assert len(chunks) > 2
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)
    last = chunks[-1]
    assert last.choices == []
    assert cached_tokens(last.usage) >= 4 * BLOCK


def test_unknown_model_is_a_404_with_the_nested_error_envelope(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )

    assert caught.value.status_code == 404
    error = caught.value.response.json()["error"]
    assert {"message", "type", "code"} <= error.keys()
    assert "no-such-model" in error["message"]


def test_tools_with_auto_choice_are_accepted(client: openai.OpenAI) -> None:
    weather: ChatCompletionToolParam = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    response = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[weather],
        tool_choice="auto",
        max_tokens=8,
    )

    assert response.choices[0].finish_reason in {"stop", "length", "tool_calls"}
