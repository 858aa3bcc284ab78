"""Anthropic Messages requests and answers, seen as the chat requests the detector renders.

A Messages prompt is, in cache order, the tools, then `system` (a string or a list of text
blocks), then the messages, whose content is a string or a list of blocks (`text`,
`tool_use`, `tool_result`, `thinking`, images, documents). The view puts `system` first
among the messages and turns `tool_use` blocks into tool calls, so every buster the chat
rendering finds (a timestamp in the system prompt, reordered tools, an edited message)
is found in Messages traffic alike.

`cache_control` marks where hosted Anthropic caches up to; it is not prompt text, so the
view drops it: a breakpoint that moves from turn to turn (as the SDK docs recommend, to
the newest message) is no prefix change. `breakpoint_message` says where the last one sits,
for the check that the cached prefix did not shrink (kvmigrate.cachecheck.tracker).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

CACHE_CONTROL = "cache_control"
# Content blocks that only the Messages API has: one of them marks a body as Messages.
_MESSAGES_BLOCKS = frozenset(
    {"tool_use", "tool_result", "thinking", "redacted_thinking", "document", "server_tool_use"}
)


def is_messages_request(body: Mapping[str, Any]) -> bool:
    """A Messages body: a top-level `system`, tools with an `input_schema`, or a block only
    Messages has. A body with none of them renders the same either way."""
    if "system" in body:
        return True
    tools = body.get("tools")
    if isinstance(tools, list) and any(
        isinstance(t, Mapping) and "input_schema" in t for t in tools
    ):
        return True
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, Mapping) else None
        for block in content if isinstance(content, list) else ():
            # Not `cache_control`: chat bodies carry it too (OpenRouter, LiteLLM).
            if isinstance(block, Mapping) and block.get("type") in _MESSAGES_BLOCKS:
                return True
    return False


def chat_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """`{"tools": [...], "messages": [...]}` in the chat shape, `system` as message 0."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str | list) and system:
        messages.append({"role": "system", "content": _parts(system)})
    for message in body.get("messages") or ():
        if isinstance(message, Mapping):
            messages.append(message_view(message))
    tools = body.get("tools")
    return {
        "tools": [_plain(t) for t in tools] if isinstance(tools, list) else [],
        "messages": messages,
    }


def view_messages(body: Mapping[str, Any]) -> Any:
    """The messages as the rendering numbers them: a Messages body's through its view."""
    return chat_view(body)["messages"] if is_messages_request(body) else body.get("messages")


def message_view(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message: text-like blocks as content parts, `tool_use` blocks as tool calls."""
    content = message.get("content")
    out: dict[str, Any] = {"role": str(message.get("role") or "user")}
    if not isinstance(content, list):
        out["content"] = content
        return out
    calls = [_call(b) for b in content if isinstance(b, Mapping) and b.get("type") == "tool_use"]
    rest = [b for b in content if not (isinstance(b, Mapping) and b.get("type") == "tool_use")]
    out["content"] = _parts(rest)
    if calls:
        out["tool_calls"] = calls
    return out


def answer_view(response: Mapping[str, Any]) -> dict[str, Any] | None:
    """The assistant message an agent appends after a Message answer."""
    content = response.get("content")
    if response.get("type") != "message" or not isinstance(content, list):
        return None
    return message_view({"role": "assistant", "content": content})


def breakpoint_message(body: Mapping[str, Any]) -> int | None:
    """The rendered index of the last message holding a `cache_control` breakpoint (-1: on
    a tool only); None when the request marks none. A chat body's index is its own (chat
    bodies may carry breakpoints too, for gateways that pass them to Anthropic)."""
    found: int | None = None
    tools = body.get("tools")
    if isinstance(tools, list) and any(_marked(t) for t in tools):
        found = -1
    system = body.get("system")
    offset = 1 if isinstance(system, str | list) and system else 0
    if offset and isinstance(system, list) and any(_marked(b) for b in system):
        found = 0
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(_marked(b) for b in content):
            found = i + offset
    return found


def _marked(block: Any) -> bool:
    return isinstance(block, Mapping) and block.get(CACHE_CONTROL) is not None


def _parts(content: str | Sequence[Any]) -> Any:
    if isinstance(content, str):
        return content
    return [_part(b) for b in content]


def _part(block: Any) -> Any:
    """Text-like blocks as text parts; others (images, documents, redacted thinking) as
    themselves without `cache_control`, which the renderer digests."""
    if not isinstance(block, Mapping):
        return block
    kind = block.get("type")
    if kind == "thinking" and isinstance(block.get("thinking"), str):
        return {"type": "text", "text": block["thinking"]}
    if kind == "tool_result":
        inner = block.get("content")
        text = inner if isinstance(inner, str) else _result_text(inner)
        return {"type": "text", "text": f"<tool_result {block.get('tool_use_id')}>{text}"}
    return _plain(block)


def _result_text(inner: Any) -> str:
    if not isinstance(inner, list):
        return "" if inner is None else json.dumps(inner, ensure_ascii=False)
    texts = [_part(b) for b in inner]
    return "".join(
        t["text"] if isinstance(t, dict) and isinstance(t.get("text"), str) else json.dumps(t)
        for t in texts
    )


def _call(block: Mapping[str, Any]) -> dict[str, Any]:
    # The input object in its key order, as the engine's template serialises it.
    arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": arguments},
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: v for k, v in value.items() if k != CACHE_CONTROL}
    return value
