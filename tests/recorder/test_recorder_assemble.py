"""A streamed answer reassembles into what the same call returns without streaming."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from recorder_support import VLLM_MODEL, WEATHER_TOOL, Backends

from kvmigrate.recorder.convert import finish_reason, tool_call_names
from kvmigrate.wire.assemble import assemble


def _post(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return bytes(response.read())


@pytest.mark.parametrize("tools", [False, True])
@pytest.mark.parametrize("backend", ["hosted", "vllm"])
def test_streamed_and_plain_chat_answers_assemble_alike(
    backends: Backends, backend: str, tools: bool
) -> None:
    server = getattr(backends, backend)
    body: dict[str, Any] = {
        "model": "gpt-4o-mini" if backend == "hosted" else VLLM_MODEL,
        "messages": [{"role": "user", "content": "Weather in Paris, please?"}],
        "max_tokens": 24, "seed": 7, "temperature": 0,
    }  # fmt: skip
    if tools:
        body |= {"tools": [WEATHER_TOOL], "tool_choice": "required"}
    url = server.url + "/v1/chat/completions"
    plain = assemble("chat/completions", _post(url, body))
    streamed = assemble(
        "chat/completions",
        _post(url, body | {"stream": True, "stream_options": {"include_usage": True}}),
    )
    assert plain is not None
    assert streamed is not None
    assert streamed["object"] == "chat.completion"
    p, s = plain["choices"][0], streamed["choices"][0]
    assert s["finish_reason"] == p["finish_reason"]
    assert s["message"]["content"] == p["message"]["content"]
    if tools:
        assert tool_call_names(streamed) == tool_call_names(plain) == ["get_weather"]
        strip = [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in p["message"]["tool_calls"]
        ]
        assert [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in s["message"]["tool_calls"]
        ] == strip
    assert streamed["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]
    assert finish_reason(streamed) == finish_reason(plain)


def test_a_broken_stream_keeps_what_arrived() -> None:
    body = (
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}\n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n'
        b'data: {"id":"c","object":"chat.comp'
    )
    out = assemble("chat/completions", body)
    assert out is not None
    assert out["choices"][0]["message"]["content"] == "Hello"
    assert out["choices"][0]["finish_reason"] is None


def test_responses_stream_returns_the_completed_response() -> None:
    completed = {"id": "resp_1", "object": "response", "status": "completed",
                 "output": [{"type": "function_call", "name": "get_weather", "arguments": "{}"}]}  # fmt: skip
    body = (
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}\n\n'
        b"event: response.completed\ndata: "
        + json.dumps({"type": "response.completed", "response": completed}).encode()
        + b"\n\n"
    )
    out = assemble("responses", body)
    assert out == completed
    assert tool_call_names(out) == ["get_weather"]
    assert finish_reason(out) == "completed"
