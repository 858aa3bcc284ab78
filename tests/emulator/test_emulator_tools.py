"""Tool calls: id shapes per dialect, streamed deltas, schema-valid arguments, agent loops."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from emulator_support import client, model_of, profile_of

from kvmigrate.serving import BackgroundServer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "hourly": {"type": "boolean"},
            },
            "required": ["city", "unit", "days"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Lisbon this week?"}]
ID_SHAPES = {"hosted": r"call_[A-Za-z0-9]{24}", "vllm": r"chatcmpl-tool-[0-9a-f]{32}"}


def _check_weather_arguments(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit", "days"}
    assert args["city"] == "Lisbon"  # a proper noun of the prompt fills a city slot
    assert args["unit"] in ("celsius", "fahrenheit")
    assert isinstance(args["days"], int)
    assert 1 <= args["days"] <= 7


def test_tool_call_non_streamed(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        reply = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=ASK,
            tools=[WEATHER],  # type: ignore[list-item]
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    assert re.fullmatch(ID_SHAPES[profile_of(any_server)], calls[0].id)
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    _check_weather_arguments(calls[0].function.arguments)  # type: ignore[union-attr]


def test_tool_call_stream_deltas_reassemble(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        stream = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=ASK,
            tools=[WEATHER],  # type: ignore[list-item]
            stream=True,
        )
        chunks = [c for c in stream if c.choices]
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    first = deltas[0][0]
    assert first.index == 0
    assert first.type == "function"
    assert first.id is not None
    assert re.fullmatch(ID_SHAPES[profile_of(any_server)], first.id)
    assert first.function is not None
    assert first.function.name == "get_weather"
    assert first.function.arguments == ""
    fragments = [d[0].function.arguments for d in deltas[1:] if d[0].function]
    assert len(fragments) > 3  # arguments arrive incrementally
    assert all(d[0].id is None for d in deltas[1:])
    _check_weather_arguments("".join(f or "" for f in fragments))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_agent_loop_answers_after_tool_result(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        first = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=ASK,
            tools=[WEATHER],  # type: ignore[list-item]
        )
        call = (first.choices[0].message.tool_calls or [])[0]
        history: list[Any] = [
            *ASK,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
        ]
        second = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=history,
            tools=[WEATHER],  # type: ignore[list-item]
        )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls in (None, [])
    answer = (second.choices[0].message.content or "").lower()
    assert any(word in answer for word in ("weather", "lisbon", "week"))


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ("none", []),
        ("required", ["get_weather"]),
        ({"type": "function", "function": {"name": "search_docs"}}, ["search_docs"]),
    ],
)
def test_tool_choice(vllm_server: BackgroundServer, tool_choice: Any, expected: list[str]) -> None:
    with client(vllm_server) as sdk:
        reply = sdk.chat.completions.create(
            model=model_of(vllm_server),
            messages=ASK,
            tools=[WEATHER, SEARCH],  # type: ignore[list-item]
            tool_choice=tool_choice,
        )
    names = [c.function.name for c in reply.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
    assert names == expected


def test_parallel_tool_calls(hosted_server: BackgroundServer) -> None:
    both = [{"role": "user", "content": "Use get_weather for Lisbon and search_docs for maps"}]
    with client(hosted_server) as sdk:
        parallel = sdk.chat.completions.create(
            model=model_of(hosted_server),
            messages=both,
            tools=[WEATHER, SEARCH],  # type: ignore[list-item]
        )
        single = sdk.chat.completions.create(
            model=model_of(hosted_server),
            messages=both,  # type: ignore[arg-type]
            tools=[WEATHER, SEARCH],  # type: ignore[list-item]
            parallel_tool_calls=False,
        )
    names = [c.function.name for c in parallel.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
    assert names == ["get_weather", "search_docs"]
    assert len({c.id for c in parallel.choices[0].message.tool_calls or []}) == 2
    assert len(single.choices[0].message.tool_calls or []) == 1


def test_unknown_forced_tool_is_400(vllm_server: BackgroundServer) -> None:
    import openai

    with client(vllm_server) as sdk, pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(
            model=model_of(vllm_server),
            messages=ASK,
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
