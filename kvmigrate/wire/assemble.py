"""Reassemble a streamed answer into the structure the same call returns without streaming.

Parity compares a primary answer with its shadow copy, and one side may have streamed while
the other did not (or both streamed in differently cut chunks). Reassembling every answer
into the non-streamed shape gives the comparators one structure to read.

Every route's assembly keeps deltas as pieces and joins them once, so its time is linear in
the answer. `assemble` reads a whole body in as few calls as it can (the recorder's worker
process, off the proxy's loop); `assemble_sliced` reads it a slice of whole events at a time
and yields between slices, for the proxy's own process: there, one long answer decoded in
one call held the event loop (or, from a thread, the GIL) for as long as it took.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol

import orjson

from kvmigrate.wire.anthropic_stream import MessagesStream, assemble_messages
from kvmigrate.wire.chat_stream import ChatStream, assemble_chat, envelope
from kvmigrate.wire.responses_stream import ResponsesStream, assemble_responses
from kvmigrate.wire.sse import event_slices, sse_data

JSON = dict[str, Any]
# What one step of `assemble_sliced` decodes: a short step for the loop, and a long
# answer in few enough steps that the hops between them cost nothing to speak of.
SLICE_BYTES = 256 * 1024


def assemble(route: str, body: bytes) -> JSON | None:
    """The non-streamed response object for a chat/completions, completions, responses or
    (Anthropic) messages answer, streamed (SSE) or not; None when the body holds no JSON
    object at all."""
    if is_sse(body):
        if route == "chat/completions":
            return assemble_chat(body)
        if route == "completions":
            return _assemble_completions(body)
        if route == "responses":
            return assemble_responses(body)
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


class StreamAssembly(Protocol):
    def feed(self, events: bytes) -> bool:
        """Whole events, in order; True once the answer is known whole (later events
        change nothing)."""

    def result(self) -> JSON | None: ...


def assemble_sliced(
    route: str, body: bytes, size: int = SLICE_BYTES
) -> Generator[None, None, JSON | None]:
    """`assemble`, a slice of about `size` bytes of whole events at a time: the generator
    yields after each slice (see kvmigrate.slices for driving it) and returns what
    `assemble` returns. A body within one slice, or not an event stream, is one step."""
    stream = _STREAMS.get(route) if len(body) > size and is_sse(body) else None
    if stream is None:
        return assemble(route, body)
    assembly = stream()
    for events in event_slices(body, size):
        if assembly.feed(events):
            break
        yield
    return assembly.result()


class _CompletionsStream:
    """Legacy `text_completion` chunks: each choice's text, joined at the end."""

    __slots__ = ("finish", "first", "texts", "usage")

    def __init__(self) -> None:
        self.first: JSON | None = None
        self.texts: dict[int, list[str]] = {}
        self.finish: dict[int, str | None] = {}
        self.usage: Any = None

    def feed(self, events: bytes) -> bool:
        for chunk in sse_data(events):
            self.first = self.first or chunk
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            for part in chunk.get("choices") or ():
                index = part.get("index", 0)
                self.texts.setdefault(index, []).append(part.get("text") or "")
                if part.get("finish_reason"):
                    self.finish[index] = part["finish_reason"]
        return False

    def result(self) -> JSON | None:
        if self.first is None:
            return None
        out = envelope(self.first, "text_completion")
        out["choices"] = [
            {"index": i, "text": "".join(parts), "finish_reason": self.finish.get(i)}
            for i, parts in sorted(self.texts.items())
        ]
        out["usage"] = self.usage
        return out


def _assemble_completions(body: bytes) -> JSON | None:
    assembly = _CompletionsStream()
    assembly.feed(body)
    return assembly.result()


_STREAMS: dict[str, Callable[[], StreamAssembly]] = {
    "chat/completions": ChatStream,
    "completions": _CompletionsStream,
    "responses": ResponsesStream,
    "messages": MessagesStream,
}
