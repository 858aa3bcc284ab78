"""Canonical rendering of a chat request, cut into segments that remember where they came from.

The text is close to a ChatML chat template (tools first, in the system turn, then each
message), so a token prefix shared by two prompts maps to a character prefix shared by their
renderings. Every field is its own segment: comparing two renderings segment by segment finds
the first difference cheaply, and the segment that holds it names the message, role and field.

Values are rendered as sent, never normalised: a tool list in another order or tool-call
arguments with other spacing change the tokens the engine sees, so they must change the text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from kvmigrate.cachecheck.messages_view import answer_view, chat_view, is_messages_request
from kvmigrate.wire.content import content_text as wire_content_text

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOLS = -1  # the `message` of the segments that render the request's `tools`
_JSON_ONLY = (
    orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


@dataclass(frozen=True, slots=True)
class Segment:
    """One field of the rendering. `text` is what the prompt holds (template glue included);
    `value` is the field's own value, the part a break classifier reads."""

    text: str
    value: str
    message: int  # index in `messages`, or TOOLS
    role: str
    field: str


@dataclass(slots=True)
class Rendering:
    segments: list[Segment] = field(default_factory=list)
    messages: int = 0  # how many messages the rendering holds

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)

    def message_keys(self) -> list[tuple[str, ...]]:
        """Each message's segment texts: equal keys mean byte-identical messages."""
        keys: list[list[str]] = [[] for _ in range(self.messages)]
        for segment in self.segments:
            if segment.message >= 0:
                keys[segment.message].append(segment.text)
        return [tuple(k) for k in keys]

    def tool_values(self) -> list[str]:
        return [
            s.value for s in self.segments if s.message == TOOLS and s.field.startswith("tools[")
        ]

    def extended(
        self, messages: Sequence[Mapping[str, Any]], memo: SegmentMemo | None = None
    ) -> Rendering:
        """This rendering with more messages appended (an append-only agent's next turn)."""
        out = Rendering(list(self.segments), self.messages)
        for message in messages:
            if memo is None:
                out.segments.extend(_message_segments(out.messages, message))
            else:
                out.segments.extend(memo.segments(out.messages, message))
            out.messages += 1
        return out


class SegmentMemo:
    """Each message's segments, by its index and the message object itself, for the next
    request of the same conversation. A conversation read from the records shares one
    object per stored message across its turns (recorder.history.inflate_rows), so with a
    memo each turn renders only the messages it adds, not its whole history again.
    Segments are immutable: they are shared as they are. It keeps the last request's
    messages only (a conversation whose turns share no objects would otherwise pile up
    every turn's), and keeps them alive, so that their ids stay theirs."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, int], tuple[Mapping[str, Any], list[Segment]]] = {}
        self._now: dict[tuple[int, int], tuple[Mapping[str, Any], list[Segment]]] = {}
        self._tools: tuple[bytes, list[Segment]] = (b"", [])

    def tools(self, tools: Sequence[Any]) -> list[Segment]:
        """The tools' segments, as the last request's when its tools were the same. Each
        request's tools are parsed on their own, so they are told equal by their orjson
        text (not `==`, which ignores key order). Only JSON values are keyed: orjson writes
        NaN as null, so a list with a null in it is rendered anew, as is one holding
        anything orjson would write otherwise than json does (it raises on those here)."""
        try:
            key = orjson.dumps(tools, option=_JSON_ONLY)
        except TypeError:
            return _tool_segments(tools)
        if b"null" in key:
            return _tool_segments(tools)
        if key != self._tools[0]:
            self._tools = (key, _tool_segments(tools))
        return list(self._tools[1])

    def segments(self, index: int, message: Mapping[str, Any]) -> list[Segment]:
        key = (index, id(message))
        seen = self._now.get(key) or self._last.get(key)
        if seen is None:
            seen = (message, _message_segments(index, message))
        self._now[key] = seen
        return seen[1]

    def request_done(self) -> None:
        self._last, self._now = self._now, {}


def render_request(body: Mapping[str, Any], memo: SegmentMemo | None = None) -> Rendering:
    """The rendering of a chat/completions request body (`tools` and `messages`), or of an
    Anthropic Messages body seen as one (kvmigrate.cachecheck.messages_view). `memo`: see
    SegmentMemo; a Messages body's view is built anew each time, so it renders without."""
    if is_messages_request(body):
        body, memo = chat_view(body), None
    messages = body.get("messages")
    tools = body.get("tools")
    return render_chat(
        messages if isinstance(messages, list) else [],
        tools if isinstance(tools, list) else [],
        memo,
    )


def render_chat(
    messages: Sequence[Any], tools: Sequence[Any] = (), memo: SegmentMemo | None = None
) -> Rendering:
    rendering = Rendering(_tool_segments(tools) if memo is None else memo.tools(tools))
    rendering = rendering.extended([m if isinstance(m, Mapping) else {} for m in messages], memo)
    if memo is not None:
        memo.request_done()
    return rendering


def answer_message(response: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The assistant message an append-only agent appends: the first choice's message, or
    a Messages answer's content blocks."""
    if not response:
        return None
    if response.get("type") == "message":
        return answer_view(response)
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        return None
    answer: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        answer["tool_calls"] = message["tool_calls"]
    return answer


def _tool_segments(tools: Sequence[Any]) -> list[Segment]:
    if not tools:
        return []
    segments = [Segment(f"{IM_START}system\n# Tools", "", TOOLS, "system", "tools")]
    for i, tool in enumerate(tools):
        value = _json(tool)
        segments.append(Segment("\n" + value, value, TOOLS, "system", f"tools[{i}]"))
    segments.append(Segment(f"\n{IM_END}\n", "", TOOLS, "system", "tools"))
    return segments


def _message_segments(index: int, message: Mapping[str, Any]) -> list[Segment]:
    role = str(message.get("role") or "user")
    segments = [Segment(f"{IM_START}{role}\n", role, index, role, "role")]
    call_id = message.get("tool_call_id")
    if call_id is not None:
        value = str(call_id)
        segments.append(
            Segment(f"<tool_call_id>{value}</tool_call_id>\n", value, index, role, "tool_call_id")
        )
    content = content_text(message.get("content"))
    segments.append(Segment(content, content, index, role, "content"))
    calls = message.get("tool_calls")
    for j, call in enumerate(calls if isinstance(calls, list) else []):
        segments.extend(_call_segments(index, role, j, call))
    segments.append(Segment(f"{IM_END}\n", "", index, role, "end"))
    return segments


def _call_segments(index: int, role: str, j: int, call: Any) -> list[Segment]:
    call = call if isinstance(call, Mapping) else {}
    function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    name = str(function.get("name") or "")
    call_id = str(call.get("id") or "")
    arguments = function.get("arguments")
    # Arguments are a JSON string on the wire; render it as sent (see the module docstring).
    args = arguments if isinstance(arguments, str) else _json(arguments)
    head = f'\n<tool_call>\n{{"id": "{call_id}", "name": "{name}", "arguments": '
    where = f"tool_calls[{j}]"
    return [
        Segment(head, f"{call_id} {name}", index, role, f"{where}.function.name"),
        Segment(args + "}\n</tool_call>", args, index, role, f"{where}.function.arguments"),
    ]


def content_text(content: Any) -> str:
    """A message's content as text: a string, text parts joined, other parts as a digest
    (an image that changes breaks the prefix as surely as text does)."""
    if content is not None and not isinstance(content, str | list):
        return _json(content)
    return wire_content_text(content, _media_digest)


def _media_digest(part: Any) -> str:
    return f"<|media:{hashlib.blake2b(_json(part).encode(), digest_size=6).hexdigest()}|>"


def _json(value: Any) -> str:
    # Key order as given and default separators, like a template's `tojson` (no sort_keys).
    return json.dumps(value, ensure_ascii=False)
