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
    assembly = MessagesStream()
    assembly.feed(body)
    return assembly.result()


class MessagesStream:
    """A Messages stream fed a slice of whole events at a time, in order."""

    __slots__ = ("growing", "message")

    def __init__(self) -> None:
        self.message: JSON | None = None
        self.growing: dict[int, _Growing] = {}

    def feed(self, events: bytes) -> bool:
        """Always False: what follows `message_stop` is read as it comes (the SDKs do)."""
        for event in sse_data(events):
            self.add(event)
        return False

    def add(self, event: JSON) -> None:
        """One event's data object."""
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            started = self.message = dict(event["message"])
            started["content"] = list(started.get("content") or [])
            usage = started.get("usage")
            started["usage"] = dict(usage) if isinstance(usage, dict) else {}
            self.growing.clear()
            return
        message = self.message
        if message is None:
            return
        if kind == "content_block_start":
            _start_block(message["content"], event, self.growing)
        elif kind == "content_block_delta":
            _add_delta(message["content"], event, self.growing)
        elif kind == "content_block_stop":
            _finish_block(message["content"], event.get("index"), self.growing)
        elif kind == "message_delta":
            _apply_message_delta(message, event)

    def result(self) -> JSON | None:
        """The Message (once: it joins what its blocks grew into them)."""
        message = self.message
        if message is not None:
            for index in list(self.growing):
                _finish_block(message["content"], index, self.growing)
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


class _Growing:
    """A block's streamed pieces, joined into it once, at its end: grown with `+` instead,
    a long answer (hundreds of thousands of text or thinking deltas) cost time in the
    square of its length. None: no delta of that kind came."""

    __slots__ = ("citations", "input", "text", "thinking")

    def __init__(self) -> None:
        self.text: list[str] | None = None
        self.thinking: list[str] | None = None
        self.input: list[str] | None = None
        self.citations: list[Any] | None = None


def _start_block(content: list[Any], event: JSON, growing: dict[int, _Growing]) -> None:
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
        growing.pop(index, None)  # a block started again: what the old one grew is gone


def _add_delta(content: list[Any], event: JSON, growing: dict[int, _Growing]) -> None:
    index = event.get("index")
    block, delta = _block_at(content, index), event.get("delta")
    if block is None or not isinstance(delta, dict):
        return
    assert isinstance(index, int)  # `_block_at` found it
    grown = growing.get(index) or growing.setdefault(index, _Growing())
    kind = delta.get("type")
    if kind == "text_delta" and isinstance(delta.get("text"), str):
        if grown.text is None:
            grown.text = [str(block.get("text") or "")]
        grown.text.append(delta["text"])
    elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
        if grown.input is None:
            grown.input = []
        grown.input.append(delta["partial_json"])
    elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
        if grown.thinking is None:
            grown.thinking = [str(block.get("thinking") or "")]
        grown.thinking.append(delta["thinking"])
    elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
        block["signature"] = delta["signature"]
    elif kind == "citations_delta" and isinstance(delta.get("citation"), dict):
        if grown.citations is None:
            grown.citations = list(block.get("citations") or ())
        grown.citations.append(delta["citation"])


def _finish_block(content: list[Any], index: Any, growing: dict[int, _Growing]) -> None:
    """A block's pieces joined into it. A tool_use block's input is its `input_json_delta`
    pieces parsed (the start event's `input` is always `{}` when the input streams)."""
    grown = growing.pop(index, None) if isinstance(index, int) else None
    block = _block_at(content, index)
    if grown is None or block is None:
        return
    if grown.text is not None:
        block["text"] = "".join(grown.text)
    if grown.thinking is not None:
        block["thinking"] = "".join(grown.thinking)
    if grown.citations is not None:
        block["citations"] = grown.citations
    if grown.input is not None:
        text = "".join(grown.input)
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
