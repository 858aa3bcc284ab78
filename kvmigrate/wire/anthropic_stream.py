"""Anthropic's Messages API answers: a streamed answer back into the Message object the same
call returns without streaming, and the usage of a stream.

A Messages stream is typed events (`event: <type>` and a `data:` object whose `type` says
the same): `message_start` carries the Message with empty `content` and the input usage;
each content block opens with `content_block_start`, grows by `content_block_delta`
(`text_delta`, `input_json_delta`, `thinking_delta`, `signature_delta`, `citations_delta`)
and ends with `content_block_stop`; `message_delta` sets `stop_reason`, `stop_sequence` and
the final usage; `message_stop` ends it; `ping` and unknown events carry nothing to keep.
The assembly follows the official SDKs' `accumulate_event`, so the reassembled object is
the one an SDK user would see from `stream.get_final_message()`.
"""

from __future__ import annotations

from typing import Any

import orjson

from kvmigrate.wire.sse import sse_data

ROUTE = "messages"  # the proxy's route name for POST /v1/messages
JSON = dict[str, Any]


def assemble_messages(body: bytes) -> JSON | None:
    """The Message a Messages SSE body adds up to; None when it holds no `message_start`.
    A stream cut short keeps the blocks that arrived; a tool input whose JSON never
    completed is the text as sent (a string, not the object a tool takes), so that parity
    and the broken-tool-call count still see the call."""
    message: JSON | None = None
    partial: dict[int, list[str]] = {}
    for event in sse_data(body):
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = dict(event["message"])
            message["content"] = list(message.get("content") or [])
            usage = message.get("usage")
            message["usage"] = dict(usage) if isinstance(usage, dict) else {}
        elif message is None:
            continue
        elif kind == "content_block_start":
            _start_block(message["content"], event)
        elif kind == "content_block_delta":
            _add_delta(message["content"], event, partial)
        elif kind == "content_block_stop":
            _finish_input(message["content"], event.get("index"), partial)
        elif kind == "message_delta":
            _apply_message_delta(message, event)
    if message is None:
        return None
    for index in list(partial):
        _finish_input(message["content"], index, partial)
    return message


def merged_stream_usage(events: list[JSON]) -> JSON | None:
    """A stream's usage: `message_start`'s, updated by every later `message_delta`'s (which
    always holds `output_tokens`, and on newer servers the input counts too)."""
    usage: JSON | None = None
    for event in events:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            start = event["message"].get("usage")
            usage = dict(start) if isinstance(start, dict) else usage
        elif kind == "message_delta" and isinstance(event.get("usage"), dict):
            usage = _merge_usage(usage or {}, event["usage"])
    return usage


def _merge_usage(usage: JSON, delta: JSON) -> JSON:
    # As the SDKs do: a value in the delta replaces the start's; a null one does not.
    return usage | {k: v for k, v in delta.items() if v is not None}


def _block_at(content: list[Any], index: Any) -> JSON | None:
    if isinstance(index, int) and 0 <= index < len(content):
        block = content[index]
        return block if isinstance(block, dict) else None
    return None


def _start_block(content: list[Any], event: JSON) -> None:
    block = event.get("content_block")
    if not isinstance(block, dict):
        return
    index = event.get("index")
    index = index if isinstance(index, int) and index >= 0 else len(content)
    while len(content) < index:
        content.append({})
    copy = dict(block)
    if index == len(content):
        content.append(copy)
    else:
        content[index] = copy


def _add_delta(content: list[Any], event: JSON, partial: dict[int, list[str]]) -> None:
    block, delta = _block_at(content, event.get("index")), event.get("delta")
    if block is None or not isinstance(delta, dict):
        return
    kind = delta.get("type")
    if kind == "text_delta" and isinstance(delta.get("text"), str):
        block["text"] = str(block.get("text") or "") + delta["text"]
    elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
        partial.setdefault(event["index"], []).append(delta["partial_json"])
    elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
        block["thinking"] = str(block.get("thinking") or "") + delta["thinking"]
    elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
        block["signature"] = delta["signature"]
    elif kind == "citations_delta" and isinstance(delta.get("citation"), dict):
        block["citations"] = [*(block.get("citations") or ()), delta["citation"]]


def _finish_input(content: list[Any], index: Any, partial: dict[int, list[str]]) -> None:
    """A tool_use block's input from its `input_json_delta` pieces (the start event's
    `input` is always `{}` when the input streams)."""
    pieces = partial.pop(index, None) if isinstance(index, int) else None
    block = _block_at(content, index)
    if pieces is None or block is None:
        return
    text = "".join(pieces)
    try:
        block["input"] = orjson.loads(text) if text.strip() else {}
    except orjson.JSONDecodeError:
        block["input"] = text


def _apply_message_delta(message: JSON, event: JSON) -> None:
    delta = event.get("delta")
    if isinstance(delta, dict):
        for key in ("stop_reason", "stop_sequence"):
            if key in delta:
                message[key] = delta[key]
    if isinstance(event.get("usage"), dict):
        message["usage"] = _merge_usage(message["usage"], event["usage"])
