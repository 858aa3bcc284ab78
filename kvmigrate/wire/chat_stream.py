"""A streamed chat completion back into the `chat.completion` the same call returns whole.

Two ways in: a whole body (`assemble_chat`: the recorder's hottest path, its fast paths
decode every chunk in one call), and slices of whole events fed in order (`ChatStream`:
what `kvmigrate.wire.assemble.assemble_sliced` feeds, so that no single step is long).
Both keep every delta as a piece and join the pieces once, at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from kvmigrate.wire.chat_chunks import ChoiceSink, DecodeError, feed_chunks, plain_choice
from kvmigrate.wire.sse import sse_data, sse_payloads


@dataclass(slots=True)
class _ToolCall:
    """One streamed tool call, its name and arguments as the pieces that came: joined once,
    at the end. Grown with `+=` instead, an agent writing a file through a tool call (tens
    of thousands of argument deltas) cost time in the square of its length."""

    id: Any = None
    type: Any = "function"
    name: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)

    def call(self) -> dict[str, Any]:
        function = {"name": "".join(self.name), "arguments": "".join(self.arguments)}
        return {"id": self.id, "type": self.type, "function": function}


@dataclass
class _Choice:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    tool_calls: dict[int, _ToolCall] = field(default_factory=dict)
    finish_reason: str | None = None

    def add_delta(self, delta: dict[str, Any]) -> None:
        # Only the keys present (usually just `content`): this runs once per streamed chunk.
        for key, value in delta.items():
            if not value:
                continue
            if key == "content" and isinstance(value, str):
                self.content.append(value)
            elif key == "tool_calls" and isinstance(value, list):
                for tool_delta in value:
                    if isinstance(tool_delta, dict):
                        self.add_tool_delta(tool_delta)
            elif key == "role" and isinstance(value, str):
                self.role = value
            elif key in ("reasoning_content", "reasoning") and isinstance(value, str):
                self.reasoning.append(value)
            elif key == "refusal" and isinstance(value, str):
                self.refusal.append(value)

    def add_tool_delta(self, delta: dict[str, Any]) -> None:
        index = delta.get("index")
        index = index if isinstance(index, int) else len(self.tool_calls)
        call = self.tool_calls.get(index) or self.tool_calls.setdefault(index, _ToolCall())
        if delta.get("id"):
            call.id = delta["id"]
        if delta.get("type"):
            call.type = delta["type"]
        function = delta.get("function")
        if not isinstance(function, dict):
            return
        if isinstance(function.get("name"), str):
            call.name.append(function["name"])
        if isinstance(function.get("arguments"), str):
            call.arguments.append(function["arguments"])

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": self.role,
            "content": "".join(self.content) if self.content else None,
        }
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i].call() for i in sorted(self.tool_calls)]
        return message


def envelope(first: dict[str, Any], obj: str) -> dict[str, Any]:
    out: dict[str, Any] = {"id": first.get("id"), "object": obj}
    for key in ("created", "model", "system_fingerprint"):
        if key in first:
            out[key] = first[key]
    return out


def assemble_chat(body: bytes) -> dict[str, Any] | None:
    # Typed decoding of the chunks as one JSON array, reached the fast way if the stream
    # is plainly framed, else line by line; chunks the types refuse take the dict path.
    for as_array in (_framed_array, _line_array):
        found = as_array(body)
        if found is None:
            continue
        try:
            plain = plain_choice(found[0])
            if plain is not None:
                out = envelope(orjson.loads(found[1]), "chat.completion")
                out["choices"] = [] if plain[0] is None else [plain[0]]
                out["usage"] = plain[1]
                return out
            choices, usage = feed_chunks(found[0], _Choice)
            return _chat_completion(orjson.loads(found[1]), choices, usage)
        except (*DecodeError, orjson.JSONDecodeError):
            continue
    return assemble_chat_dicts(sse_data(body))


def _line_array(body: bytes) -> tuple[bytes, bytes] | None:
    """(every `data:` object line joined into one JSON array, the first of them)."""
    payloads = sse_payloads(body)
    if not payloads:
        return None
    return b"[" + b",".join(payloads) + b"]", payloads[0]


_EVENT_GAP = b"\n\ndata: "
_DONE = b"\n\ndata: [DONE]\n\n"


def _framed_array(body: bytes) -> tuple[bytes, bytes] | None:
    """(the events as one JSON array, the first event) for a stream framed exactly as
    OpenAI and vLLM frame it: `data: {json}` events, a blank line after each, `[DONE]` at
    the end. One `replace` instead of a regex pass: a raw newline cannot occur inside
    JSON, so every `\\n\\ndata: ` is a boundary; any other framing (comments, `event:`
    lines, CRLF) leaves bytes that fail to decode, and the caller takes the general path."""
    if not (body.startswith(b"data: {") and body.endswith(_DONE)):
        return None
    events = body[6 : -len(_DONE)]
    first_end = events.find(b"\n")
    first = events if first_end < 0 else events[:first_end]
    return b"[" + events.replace(_EVENT_GAP, b",") + b"]", first


def assemble_chat_dicts(chunks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The general path: chunks as dicts, whatever their member types (a member of the
    wrong type is skipped, never a reason to lose the whole answer)."""
    if not chunks:
        return None
    choices: dict[int, ChoiceSink] = {}
    usage = _feed_dicts(chunks, choices)
    return _chat_completion(chunks[0], choices, usage)


def _feed_dicts(chunks: list[dict[str, Any]], choices: dict[int, ChoiceSink]) -> Any:
    """Feed chunks as dicts to `choices`; returns their last non-empty usage (None: none)."""
    usage: Any = None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for part in chunk.get("choices") or ():
            if not isinstance(part, dict):
                continue
            index = part.get("index")
            index = index if isinstance(index, int) else 0
            choice = choices.get(index) or choices.setdefault(index, _Choice())
            if isinstance(part.get("delta"), dict):
                choice.add_delta(part["delta"])
            if isinstance(part.get("finish_reason"), str):
                choice.finish_reason = part["finish_reason"]
    return usage


class ChatStream:
    """A chat stream fed a slice of whole events at a time, in order; `result` is what
    `assemble_chat` makes of the whole body. Each slice is decoded typed where its chunks
    fit the types, else as dicts."""

    __slots__ = ("choices", "first", "usage")

    def __init__(self) -> None:
        self.first: dict[str, Any] | None = None
        self.choices: dict[int, ChoiceSink] = {}
        self.usage: Any = None

    def feed(self, events: bytes) -> bool:
        """Always False: a chat stream says nothing is to follow only by ending."""
        payloads = sse_payloads(events)
        if payloads:
            try:
                _, usage = feed_chunks(b"[" + b",".join(payloads) + b"]", _Choice, self.choices)
                first = orjson.loads(payloads[0]) if self.first is None else None
            except (*DecodeError, orjson.JSONDecodeError):
                pass
            else:
                self._took(first, usage)
                return False
        chunks = sse_data(events)
        if chunks:
            self._took(chunks[0], _feed_dicts(chunks, self.choices))
        return False

    def _took(self, first: dict[str, Any] | None, usage: Any) -> None:
        if self.first is None:
            self.first = first
        if usage is not None:
            self.usage = usage

    def result(self) -> dict[str, Any] | None:
        if self.first is None:
            return None
        return _chat_completion(self.first, self.choices, self.usage)


def _chat_completion(
    first: dict[str, Any], choices: Mapping[int, ChoiceSink], usage: Any
) -> dict[str, Any]:
    out = envelope(first, "chat.completion")
    out["choices"] = [
        {"index": i, "message": c.message(), "finish_reason": c.finish_reason}
        for i, c in sorted(choices.items())
    ]
    out["usage"] = usage
    return out
