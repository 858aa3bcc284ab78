"""Are a model's tool calls usable? Checked on the candidate alone, with no primary to
compare with, so split-mode traffic can pull a candidate whose tool parser is broken."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson


def declared_tools(request: Mapping[str, Any]) -> set[str]:
    """The function names a chat request offers (`tools[].function.name`)."""
    names = set()
    for tool in request.get("tools") or ():
        if isinstance(tool, dict):
            function = tool.get("function")
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                names.add(function["name"])
    return names


def invalid_tool_calls(request: Mapping[str, Any], response: Mapping[str, Any]) -> tuple[int, int]:
    """(tool calls, invalid ones) in a chat completion: a call is invalid when it names a
    tool the request did not offer, or its arguments are not a JSON object."""
    offered = declared_tools(request)
    total = invalid = 0
    for choice in response.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        for call in (message or {}).get("tool_calls") or ():
            total += 1
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or function.get("name") not in offered:
                invalid += 1
                continue
            try:
                arguments = orjson.loads(function.get("arguments") or "")
            except orjson.JSONDecodeError:
                invalid += 1
                continue
            invalid += not isinstance(arguments, dict)
    return total, invalid
