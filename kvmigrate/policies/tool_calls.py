"""Are a model's tool calls usable? Checked on the candidate alone, with no primary to
compare with, so split-mode traffic can pull a candidate whose tool parser is broken."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from kvmigrate.wire.anthropic_stream import ROUTE as MESSAGES_ROUTE

# The routes whose answers carry tool calls this module can read.
TOOL_ROUTES = frozenset({"chat/completions", MESSAGES_ROUTE})


def declared_tools(request: Mapping[str, Any]) -> set[str]:
    """The tool names a request offers: chat's `tools[].function.name`, Anthropic's
    `tools[].name`."""
    names = set()
    for tool in request.get("tools") or ():
        if isinstance(tool, dict):
            # chat's function and custom tools nest their name; Anthropic's does not
            nested = tool.get("function") or tool.get("custom")
            holder = nested if isinstance(nested, dict) else tool
            if isinstance(holder.get("name"), str):
                names.add(holder["name"])
    return names


def invalid_tool_calls(request: Mapping[str, Any], response: Mapping[str, Any]) -> tuple[int, int]:
    """(tool calls, invalid ones) in a chat completion or an Anthropic Message: a call is
    invalid when it names a tool the request did not offer, or its arguments are not a
    JSON object."""
    offered = declared_tools(request)
    total = invalid = 0
    for name, arguments in _calls(response):
        total += 1
        invalid += name not in offered or not isinstance(arguments, dict)
    return total, invalid


def _calls(response: Mapping[str, Any]) -> Iterator[tuple[Any, Any]]:
    """(name, parsed arguments) of each call; arguments that do not parse are None."""
    for choice in response.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        for call in (message or {}).get("tool_calls") or ():
            custom = call.get("custom") if isinstance(call, dict) else None
            if isinstance(custom, dict):  # a custom tool: free-text input, valid as text
                text = custom.get("input")
                yield custom.get("name"), {"input": text} if isinstance(text, str) else None
                continue
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                yield None, None
                continue
            try:
                yield function.get("name"), orjson.loads(function.get("arguments") or "")
            except orjson.JSONDecodeError:
                yield function.get("name"), None
    if response.get("type") == "message":
        for block in response.get("content") or ():
            if isinstance(block, dict) and block.get("type") == "tool_use":
                # A stream cut inside the input leaves its text: not an object, so invalid.
                yield block.get("name"), block.get("input")
