"""What the plugin reads of LiteLLM's `/v1/messages` calls: the client's metadata, and the
answer in Anthropic's shape from what LiteLLM logs. Tables, without LiteLLM."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from kvmigrate.litellm_bridge.messages import from_chat, messages_answer
from kvmigrate.litellm_bridge.request import (
    client_body,
    client_metadata,
    forwarded_body,
    route_of,
)

CHAT = {
    "id": "chatcmpl-1",
    "model": "claude-haiku",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "Looking it up.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "search", "arguments": '{"q": "kv"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 7},
}


def test_a_logged_chat_completion_reads_as_the_messages_answer_it_was() -> None:
    assert from_chat(CHAT) == {
        "id": "chatcmpl-1",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku",
        "content": [
            {"type": "text", "text": "Looking it up."},
            {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "kv"}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 12, "output_tokens": 7},
    }


@pytest.mark.parametrize(
    ("finish", "stop"),
    [("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use"), (None, None)],
)
def test_stop_reasons(finish: str | None, stop: str | None) -> None:
    chat = {"choices": [{"finish_reason": finish, "message": {"content": "x"}}]}
    assert from_chat(chat)["stop_reason"] == stop


@pytest.mark.parametrize(
    "chat",
    [{}, {"choices": []}, {"choices": ["x"]}, {"choices": [{"message": None}], "usage": 3}],
)
def test_a_chat_completion_without_the_usual_parts_reads_as_an_empty_answer(
    chat: dict[str, Any],
) -> None:
    answer = from_chat(chat)
    assert answer["content"] == []
    assert answer["usage"] == {"input_tokens": None, "output_tokens": None}


def test_unparseable_tool_arguments_are_kept_aside() -> None:
    chat = {"choices": [{"message": {"tool_calls": [{"function": {"arguments": "{oops"}}]}}]}
    assert from_chat(chat)["content"][0]["input"] == {"_raw": "{oops"}


ANTHROPIC = {"id": "msg_1", "type": "message", "content": [{"type": "text", "text": "hi"}]}


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        # Non-streamed, LiteLLM keeps the upstream's body: kept as it came.
        (orjson.dumps(ANTHROPIC).decode(), orjson.dumps(ANTHROPIC)),
        (orjson.dumps(ANTHROPIC), orjson.dumps(ANTHROPIC)),
        # Streamed (nothing kept), or a body of another shape: the chat completion rewritten.
        (None, orjson.dumps(from_chat(CHAT))),
        ('{"object": "chat.completion"}', orjson.dumps(from_chat(CHAT))),
        ("not json", orjson.dumps(from_chat(CHAT))),
    ],
)
def test_messages_answer(original: object, expected: bytes) -> None:
    assert messages_answer({"original_response": original}, CHAT) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # /v1/messages and /v1/responses: LiteLLM's own goes under `litellm_metadata`.
        ({"metadata": {"user_id": "u-1"}, "litellm_metadata": {"x": 1}}, {"user_id": "u-1"}),
        # Chat: LiteLLM's `metadata`, the client's kept inside it.
        ({"metadata": {"user_api_key": "h", "requester_metadata": {"team": "a"}}}, {"team": "a"}),
        ({"metadata": {"user_api_key": "h"}}, None),  # the client sent none
        ({"metadata": "junk"}, None),
        ({}, None),
    ],
)
def test_client_metadata(data: dict[str, Any], expected: dict[str, Any] | None) -> None:
    assert client_metadata(data) == expected


def test_the_client_body_keeps_the_clients_metadata_and_a_copy_sends_none() -> None:
    data = {
        "model": "claude-haiku",
        "metadata": {"user_id": "u-1"},
        "litellm_metadata": {"headers": {}},
        "litellm_call_id": "c-1",
        "proxy_server_request": {
            "body": {"model": "claude-haiku", "max_tokens": 9, "messages": [], "api_key": "sk"}
        },
    }
    body = client_body(data)
    assert body == {
        "model": "claude-haiku",
        "max_tokens": 9,
        "messages": [],
        "api_key": "sk",
        "metadata": {"user_id": "u-1"},
    }
    assert route_of("anthropic_messages") == "messages"
    # OpenAI's and Anthropic's request fields only: no key, no metadata for LiteLLM to read.
    assert forwarded_body(body, "messages") == {
        "model": "claude-haiku",
        "max_tokens": 9,
        "messages": [],
    }
