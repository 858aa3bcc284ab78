"""Tool-call checks over whole responses: counts across several calls and choices (so a
counter that resets, or a loop that stops at the first bad call, shows), and shapes that are
not what they should be (a choice or call that is not an object, a tool without a name)."""

from __future__ import annotations

from typing import Any

import pytest

from kvmigrate.policies.tool_calls import declared_tools, invalid_tool_calls


def tool(name: object) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {}}}


def call(name: str, arguments: str | None = "{}") -> dict[str, Any]:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


def choices(*calls_per_choice: list[Any]) -> dict[str, Any]:
    return {
        "choices": [
            {"index": i, "message": {"role": "assistant", "tool_calls": calls}}
            for i, calls in enumerate(calls_per_choice)
        ]
    }


REQUEST = {"tools": [tool("search"), tool("read")]}


@pytest.mark.parametrize(
    ("request_body", "names"),
    [
        ({"tools": [tool("search"), tool("read")]}, {"search", "read"}),
        ({"tools": [tool(5), tool("read")]}, {"read"}),  # a name that is not a string
        ({"tools": [{"type": "function", "function": "search"}]}, set()),
        ({"tools": ["search", tool("read")]}, {"read"}),
        ({"tools": None}, set()),
        ({}, set()),
        # OpenAI's custom tools (free-text input) nest their name as functions do
        ({"tools": [{"type": "custom", "custom": {"name": "apply_patch"}}]}, {"apply_patch"}),
    ],
)
def test_declared_tools(request_body: dict[str, Any], names: set[str]) -> None:
    assert declared_tools(request_body) == names


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (choices([call("search"), call("read", '{"path": "a"}')]), (2, 0)),
        (choices([call("search"), call("search")], [call("read")]), (3, 0)),
        # Several bad calls in a row: each one counts, and the check goes on after it.
        (choices([call("nope"), call("nope"), call("search")]), (3, 2)),
        (choices([call("search", "{oops"), call("read", "[1]"), call("read", "")]), (3, 3)),
        (choices([call("search", "{oops"), call("search", "{oops"), call("read")]), (3, 2)),
        (choices([call("search", '"text"'), call("search", "1"), call("read")]), (3, 2)),
        (choices([call("read", None)]), (1, 1)),  # no arguments at all
        (choices(["not a call", {"function": "nope"}, call("read")]), (3, 2)),
        ({"choices": ["not a choice", {"message": None}]}, (0, 0)),
        ({"choices": None}, (0, 0)),
    ],
)
def test_invalid_tool_calls(response: dict[str, Any], expected: tuple[int, int]) -> None:
    assert invalid_tool_calls(REQUEST, response) == expected


def custom_call(name: str, text: object) -> dict[str, Any]:
    return {"id": "c", "type": "custom", "custom": {"name": name, "input": text}}


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        ([custom_call("apply_patch", "*** Begin Patch")], (1, 0)),  # free text is its input
        ([custom_call("apply_patch", "")], (1, 0)),
        ([custom_call("rm_rf", "/")], (1, 1)),  # a tool the request did not offer
        ([custom_call("apply_patch", {"not": "text"})], (1, 1)),
    ],
)
def test_custom_tool_calls_are_judged_by_name_and_text(
    calls: list[Any], expected: tuple[int, int]
) -> None:
    request = {"tools": [{"type": "custom", "custom": {"name": "apply_patch"}}]}
    assert invalid_tool_calls(request, choices(calls)) == expected
