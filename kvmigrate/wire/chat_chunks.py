"""Typed decoding of streamed chat chunks: the recorder's hottest path.

Every streamed answer the recorder keeps is reassembled from its chunks, and an answer of
a few hundred tokens is a few hundred chunks. Decoding them into dicts with orjson and
walking those with `.get` allocates every field; msgspec decodes only the fields
reassembly reads (skipping `id`, `object`, `model`, ... without allocating them) into
typed structs, in about half the time. Anything these types do not admit (a provider that
sends `index: null`, a non-string content) raises, and the caller takes the general path.
The structs are not tracked by the cyclic collector (`gc=False`): decoded JSON holds no
cycles, and tracking three objects a chunk is a cost paid on every chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Annotated, Any, Literal, Protocol

import msgspec


class _Function(msgspec.Struct, gc=False, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class _ToolDelta(msgspec.Struct, gc=False, omit_defaults=True):
    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: _Function | None = None


class _Delta(msgspec.Struct, gc=False, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolDelta] | None = None


class _Part(msgspec.Struct, gc=False):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct, gc=False):
    choices: list[_Part] | None = None
    usage: dict[str, Any] | None = None


_DECODER = msgspec.json.Decoder(list[_Chunk])
DecodeError = (msgspec.DecodeError, msgspec.ValidationError)


# The plain stream: one choice, text only. Most answers are this, and their chunks can be
# read with comprehensions instead of a loop of checks per chunk. The types admit nothing
# else: a tool call, a second choice, reasoning, a refusal or any delta key not named
# here fails to decode (at its first chunk, so cheaply) and the caller takes the path
# above.
class _PlainDelta(msgspec.Struct, gc=False, frozen=True, forbid_unknown_fields=True):
    role: str | None = None
    content: str | None = None
    refusal: None = None
    reasoning_content: None = None
    reasoning: None = None
    tool_calls: Annotated[list[Any], msgspec.Meta(max_length=0)] | None = None


_NO_DELTA = _PlainDelta()


class _PlainPart(msgspec.Struct, gc=False):
    index: Literal[0] = 0
    delta: _PlainDelta = _NO_DELTA
    finish_reason: str | None = None


class _PlainChunk(msgspec.Struct, gc=False):
    choices: list[_PlainPart] | None = None
    usage: dict[str, Any] | None = None


_PLAIN_DECODER = msgspec.json.Decoder(list[_PlainChunk])
_CONTENT = attrgetter("delta.content")


def plain_choice(array: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None] | None:
    """(the single choice in its non-streamed shape, or None when no chunk had one; the
    last non-empty usage) for a JSON array of plain chat chunks; None when the chunks are
    not plain, and `feed_chunks` must read them."""
    try:
        chunks = _PLAIN_DECODER.decode(array)
    except DecodeError:
        return None
    usages = [c.usage for c in chunks if c.usage]
    usage = usages[-1] if usages else None
    parts = [p for c in chunks if c.choices for p in c.choices]
    if not parts:
        return None, usage
    roles = [p.delta.role for p in parts if p.delta.role]
    reasons = [p.finish_reason for p in parts if p.finish_reason]
    text = "".join(filter(None, map(_CONTENT, parts)))
    message = {"role": roles[-1] if roles else "assistant", "content": text or None}
    choice = {"index": 0, "message": message, "finish_reason": reasons[-1] if reasons else None}
    return choice, usage


class ChoiceSink(Protocol):
    """Where one choice's deltas go (`kvmigrate.wire.chat_stream._Choice`)."""

    content: list[str]
    finish_reason: str | None

    def add_delta(self, delta: dict[str, Any]) -> None: ...

    def message(self) -> dict[str, Any]: ...


_EMPTY = _Delta()


def feed_chunks(
    array: bytes,
    new_sink: Callable[[], ChoiceSink],
    sinks: dict[int, ChoiceSink] | None = None,
) -> tuple[dict[int, ChoiceSink], dict[str, Any] | None]:
    """Decode a JSON array of chat chunks and feed each choice's deltas to its sink (in
    `sinks`, when earlier chunks made some); returns the sinks by choice index and the last
    non-empty usage of these chunks. Raises one of `DecodeError` when the chunks do not
    fit the types, before any sink is fed."""
    sinks = {} if sinks is None else sinks
    usage: dict[str, Any] | None = None
    for chunk in _DECODER.decode(array):
        if chunk.usage:
            usage = chunk.usage
        for part in chunk.choices or ():
            sink = sinks.get(part.index) or sinks.setdefault(part.index, new_sink())
            delta = part.delta
            if delta is not None:
                if (
                    delta.content
                    and delta.role is None
                    and delta.tool_calls is None
                    and delta.reasoning_content is None
                    and delta.reasoning is None
                    and delta.refusal is None
                ):  # inline, not a helper: this runs once per streamed token
                    sink.content.append(delta.content)
                elif delta != _EMPTY:
                    sink.add_delta(msgspec.to_builtins(delta))
            if part.finish_reason:
                sink.finish_reason = part.finish_reason
    return sinks, usage
