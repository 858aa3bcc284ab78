"""A Responses API stream back into the response object the same call returns whole.

A whole stream ends with that object (`response.completed`, `.incomplete` or `.failed`).
One cut short is rebuilt from the last snapshot it carried (`response.created`,
`response.in_progress`) and the output items that streamed after it: each opens with
`response.output_item.added`, grows by `response.output_text.delta` (a message) or
`response.function_call_arguments.delta` (a function call), and arrives whole with
`response.output_item.done`. Deltas are kept as pieces and joined once: an agent writing a
file through a function call streams tens of thousands of them.
"""

from __future__ import annotations

from typing import Any

from kvmigrate.wire.sse import sse_events

JSON = dict[str, Any]
_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_TEXT = "response.output_text.delta"
_ARGUMENTS = "response.function_call_arguments.delta"
_ITEM_EVENTS = frozenset({"response.output_item.added", "response.output_item.done"})


def assemble_responses(body: bytes) -> JSON | None:
    """The response object a Responses SSE body adds up to; None when it carried none."""
    assembly = ResponsesStream()
    assembly.feed(body)
    return assembly.result()


class ResponsesStream:
    """A Responses stream fed a slice of whole events at a time, in order."""

    __slots__ = ("final", "items", "snapshot")

    def __init__(self) -> None:
        self.snapshot: JSON | None = None
        self.final: JSON | None = None
        self.items = _OutputItems()

    def feed(self, events: bytes) -> bool:
        """True once the stream's last event, the whole response, has come."""
        if self.final is not None:
            return True
        return any(self.add(event, data) for event, data in sse_events(events))

    def add(self, event: str, data: JSON) -> bool:
        """One event (its name, its data object); True once the whole response came."""
        kind = data.get("type") or event or ""
        response = data.get("response")
        if not isinstance(response, dict):
            self.items.add(kind, data)
            return False
        self.snapshot = response
        if kind in _ENDS:
            self.final = response
        return self.final is not None

    def result(self) -> JSON | None:
        if self.final is not None or self.snapshot is None:
            return self.final
        output = self.items.output()
        if output and not self.snapshot.get("output"):
            return {**self.snapshot, "output": output}
        return self.snapshot


class _OutputItems:
    """The output items of a stream cut short, by their `output_index`."""

    __slots__ = ("arguments", "done", "items", "text")

    def __init__(self) -> None:
        self.items: dict[int, JSON] = {}
        self.done: set[int] = set()
        self.text: dict[int, list[str]] = {}
        self.arguments: dict[int, list[str]] = {}

    def add(self, kind: str, data: JSON) -> None:
        index = data.get("output_index")
        index = index if isinstance(index, int) else -1  # a server that does not say
        if kind == _TEXT and isinstance(data.get("delta"), str):
            pieces = self.text.get(index) or self.text.setdefault(index, [])
            pieces.append(data["delta"])
        elif kind == _ARGUMENTS and isinstance(data.get("delta"), str):
            pieces = self.arguments.get(index) or self.arguments.setdefault(index, [])
            pieces.append(data["delta"])
        elif kind in _ITEM_EVENTS and isinstance(data.get("item"), dict):
            self.items[index] = dict(data["item"])
            if kind == "response.output_item.done":
                self.done.add(index)

    def output(self) -> list[JSON]:
        if not self.items and not self.arguments:
            # Text deltas alone (a server that sends no item events): one message.
            text = "".join(piece for index in sorted(self.text) for piece in self.text[index])
            return [_message({}, text)] if text else []
        indexes = sorted(self.items.keys() | self.text.keys() | self.arguments.keys())
        return [self._item(index) for index in indexes]

    def _item(self, index: int) -> JSON:
        item = self.items.get(index, {})
        if index in self.done:
            return item  # whole as the server sent it, its deltas included
        if index in self.arguments or item.get("type") == "function_call":
            arguments = "".join(self.arguments.get(index, ()))
            return {"type": "function_call", **item, "arguments": arguments}
        if index in self.text or item.get("type") == "message":
            return _message(item, "".join(self.text.get(index, ())))
        return item  # another kind (reasoning, a tool's own call) as it was announced


def _message(item: JSON, text: str) -> JSON:
    return {
        "type": "message",
        "role": "assistant",
        **item,
        "content": [{"type": "output_text", "text": text}],
    }
