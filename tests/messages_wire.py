"""Anthropic Messages answers as they come off the wire, for the evidence tests.

`message(...)` builds the Message a non-streamed call returns; `stream(message)` the SSE
body the same call streams, framed as Anthropic frames it (`event:` and `data:` lines, a
`ping` after the first block opens, tool inputs cut into `input_json_delta` pieces, the
input usage in `message_start` and the output count in `message_delta`). The stream is
written from the Message, not from our assembler, so reassembling it must give the Message
back. `chunks(body, size)` cuts a body as a network would, across events and lines.
"""

from __future__ import annotations

import json
from typing import Any

MODEL = "claude-sonnet-4-5"


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def thinking(value: str, signature: str = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxq") -> dict[str, Any]:
    return {"type": "thinking", "thinking": value, "signature": signature}


def usage(
    input_tokens: int, output_tokens: int, *, read: int = 0, write: int = 0
) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
        "output_tokens": output_tokens,
    }


def message(
    content: list[dict[str, Any]],
    stop_reason: str = "end_turn",
    use: dict[str, Any] | None = None,
    msg_id: str = "msg_01XFDUDYJgAACzvnptvVoYEL",
    model: str = MODEL,
) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": use or usage(20, 10),
    }


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, separators=(',', ':'))}\n\n"


def _block_events(index: int, block: dict[str, Any]) -> list[str]:
    kind = block["type"]
    if kind == "text":
        opened, deltas = (
            {"type": "text", "text": ""},
            [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"], 7)],
        )
    elif kind == "tool_use":
        opened = {**block, "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": piece}
            for piece in ["", *_pieces(json.dumps(block["input"]), 5)]
        ]
    elif kind == "thinking":
        opened = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            *({"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"], 9)),
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    else:
        raise ValueError(kind)
    events = [_event("content_block_start", {"index": index, "content_block": opened})]
    if index == 0:
        events.append('event: ping\ndata: {"type": "ping"}\n\n')
    events += [_event("content_block_delta", {"index": index, "delta": d}) for d in deltas]
    events.append(_event("content_block_stop", {"index": index}))
    return events


def _pieces(value: str, size: int) -> list[str]:
    return [value[i : i + size] for i in range(0, len(value), size)] or [""]


def stream(full: dict[str, Any]) -> bytes:
    """The SSE body of `full`, as the hosted API streams it."""
    start_usage = {**full["usage"], "output_tokens": 1}
    start = {**full, "content": [], "stop_reason": None, "stop_sequence": None}
    events = [_event("message_start", {"message": {**start, "usage": start_usage}})]
    for index, block in enumerate(full["content"]):
        events += _block_events(index, block)
    delta = {"stop_reason": full["stop_reason"], "stop_sequence": full["stop_sequence"]}
    final = {"output_tokens": full["usage"]["output_tokens"]}
    events.append(_event("message_delta", {"delta": delta, "usage": final}))
    events.append(_event("message_stop", {}))
    return "".join(events).encode()


def body(full: dict[str, Any]) -> bytes:
    return json.dumps(full).encode()


def chunks(data: bytes, size: int = 37) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def request(
    turns: list[dict[str, Any]],
    system: Any = "You are a helpful assistant.",
    tools: list[dict[str, Any]] | None = None,
    stream_it: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 1024,
        "system": system,
        "messages": turns,
        "stream": stream_it,
    }
    if tools is not None:
        out["tools"] = tools
    return out


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a given location",
    "input_schema": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    },
}
