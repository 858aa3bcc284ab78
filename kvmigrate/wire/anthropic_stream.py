"""A streamed Anthropic Messages answer reassembled into the message the same call returns
without streaming: content blocks (text, tool_use with its input parsed, thinking), the stop
reason, and usage, `message_start`'s counts updated by `message_delta`'s.

Read off the response path: conversation identity links the answer a client will resend,
and records read its usage (cache reads and writes are in `message_start`).
"""

from __future__ import annotations

from typing import Any

import orjson

from kvmigrate.wire.sse import sse_events

_DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}


def assemble_messages(body: bytes) -> dict[str, Any] | None:
    """The `message` object of a Messages event stream; None without a `message_start`."""
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    for _name, event in sse_events(body):
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = dict(event["message"])
            message["usage"] = dict(message.get("usage") or {})
        elif message is None:
            continue
        elif kind == "content_block_start":
            _start(event, blocks)
        elif kind == "content_block_delta":
            _delta(event, blocks, partial)
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict):
                message.update({k: v for k, v in delta.items() if k != "type"})
            if isinstance(event.get("usage"), dict):
                message["usage"].update(event["usage"])
    if message is None:
        return None
    for index, pieces in partial.items():
        blocks[index]["input"] = _tool_input("".join(pieces))
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


def _start(event: dict[str, Any], blocks: dict[int, dict[str, Any]]) -> None:
    index, block = event.get("index"), event.get("content_block")
    if isinstance(index, int) and isinstance(block, dict):
        blocks[index] = dict(block)


def _delta(
    event: dict[str, Any], blocks: dict[int, dict[str, Any]], partial: dict[int, list[str]]
) -> None:
    index, delta = event.get("index"), event.get("delta")
    if not isinstance(index, int) or index not in blocks or not isinstance(delta, dict):
        return
    kind = delta.get("type")
    if kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
        partial.setdefault(index, []).append(delta["partial_json"])
        return
    name = _DELTA_FIELDS.get(kind) if isinstance(kind, str) else None
    if name is not None and isinstance(delta.get(name), str):
        block = blocks[index]
        block[name] = str(block.get(name) or "") + delta[name]


def _tool_input(text: str) -> Any:
    """The tool's input as the non-streamed answer has it: the JSON object its deltas spell,
    or, when they do not parse (a stream cut short), the text as sent."""
    if not text:
        return {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
