"""Reassemble a streamed answer into the structure the same call returns without streaming.

Parity compares a primary answer with its shadow copy, and one side may have streamed while
the other did not (or both streamed in differently cut chunks). Reassembling every answer
into the non-streamed shape gives the comparators one structure to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from kvmigrate.wire.anthropic_stream import assemble_messages
from kvmigrate.wire.chat_chunks import ChoiceSink, DecodeError, feed_chunks, plain_choice
from kvmigrate.wire.sse import sse_data, sse_events, sse_payloads


def assemble(route: str, body: bytes) -> dict[str, Any] | None:
    """The non-streamed response object for a chat/completions, completions, responses or
    (Anthropic) messages answer, streamed (SSE) or not; None when the body holds no JSON
    object at all."""
    if is_sse(body):
        if route == "chat/completions":
            return _assemble_chat(body)
        if route == "completions":
            return _assemble_completions(body)
        if route == "responses":
            return _assemble_responses(body)
        if route == "messages":
            return assemble_messages(body)
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def is_sse(body: bytes) -> bool:
    head = body[:64].lstrip()
    return head.startswith((b"data:", b"event:", b":"))


@dataclass
class _Choice:
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
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
        call = self.tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if delta.get("id"):
            call["id"] = delta["id"]
        if delta.get("type"):
            call["type"] = delta["type"]
        function = delta.get("function")
        if not isinstance(function, dict):
            return
        if isinstance(function.get("name"), str):
            call["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            call["function"]["arguments"] += function["arguments"]

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
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message


def _envelope(first: dict[str, Any], obj: str) -> dict[str, Any]:
    out: dict[str, Any] = {"id": first.get("id"), "object": obj}
    for key in ("created", "model", "system_fingerprint"):
        if key in first:
            out[key] = first[key]
    return out


def _assemble_chat(body: bytes) -> dict[str, Any] | None:
    # Typed decoding of the chunks as one JSON array, reached the fast way if the stream
    # is plainly framed, else line by line; chunks the types refuse take the dict path.
    for as_array in (_framed_array, _line_array):
        found = as_array(body)
        if found is None:
            continue
        try:
            plain = plain_choice(found[0])
            if plain is not None:
                out = _envelope(orjson.loads(found[1]), "chat.completion")
                out["choices"] = [] if plain[0] is None else [plain[0]]
                out["usage"] = plain[1]
                return out
            choices, usage = feed_chunks(found[0], _Choice)
            return _chat_completion(orjson.loads(found[1]), choices, usage)
        except (*DecodeError, orjson.JSONDecodeError):
            continue
    return _assemble_chat_dicts(sse_data(body))


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


def _assemble_chat_dicts(chunks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The general path: chunks as dicts, whatever their member types (a member of the
    wrong type is skipped, never a reason to lose the whole answer)."""
    if not chunks:
        return None
    choices: dict[int, _Choice] = {}
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
    return _chat_completion(chunks[0], choices, usage)


def _chat_completion(
    first: dict[str, Any], choices: Mapping[int, ChoiceSink], usage: Any
) -> dict[str, Any]:
    out = _envelope(first, "chat.completion")
    out["choices"] = [
        {"index": i, "message": c.message(), "finish_reason": c.finish_reason}
        for i, c in sorted(choices.items())
    ]
    out["usage"] = usage
    return out


def _assemble_completions(body: bytes) -> dict[str, Any] | None:
    first: dict[str, Any] | None = None
    texts: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    usage: Any = None
    for chunk in sse_data(body):
        first = first or chunk
        if chunk.get("usage"):
            usage = chunk["usage"]
        for part in chunk.get("choices") or ():
            index = part.get("index", 0)
            texts.setdefault(index, []).append(part.get("text") or "")
            if part.get("finish_reason"):
                finish[index] = part["finish_reason"]
    if first is None:
        return None
    out = _envelope(first, "text_completion")
    out["choices"] = [
        {"index": i, "text": "".join(parts), "finish_reason": finish.get(i)}
        for i, parts in sorted(texts.items())
    ]
    out["usage"] = usage
    return out


def _assemble_responses(body: bytes) -> dict[str, Any] | None:
    """The Responses API ends its stream with the whole response object; a stream cut short
    falls back to the last snapshot it carried, with the text deltas that followed."""
    snapshot: dict[str, Any] | None = None
    text: list[str] = []
    for event, data in sse_events(body):
        kind = data.get("type") or event or ""
        response = data.get("response")
        if isinstance(response, dict):
            snapshot = response
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                return response
        elif kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
            text.append(data["delta"])
    if snapshot is None:
        return None
    if text and not snapshot.get("output"):
        snapshot = {
            **snapshot,
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "".join(text)}],
                }
            ],
        }
    return snapshot
