"""Server-sent events as the OpenAI-compatible APIs send them.

One incremental decoder, after the WHATWG event-stream rules and in the shape of httpx-sse's
`SSEDecoder`: bytes go in as they arrive, cut anywhere (inside a line, inside a `\\r\\n`,
inside a UTF-8 sequence), and events come out. Its two layers serve separately too: the
proxy's stream check reads `LineDecoder` lines through `field`, because it must judge each
line before the chunk that ends it is relayed, not once the event is complete.

Lines and data stay bytes: orjson reads bytes, and a UTF-8 sequence cut between two chunks
is whole again by the time a line is complete. Only the event name and id are decoded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import orjson

_CR = 13
_LF = 10
# ServerSentEvent from a whole tuple, skipping NamedTuple's keyword-handling `__new__`:
# one event a chunk makes that a fifth of a whole body's decoding.
_new_event = tuple.__new__


class ServerSentEvent(NamedTuple):
    event: str = "message"
    data: bytes = b""  # the event's `data:` lines joined by `\n`
    id: str = ""  # the last event id: it carries over to the events that do not set one
    retry: int | None = None  # set by this event's `retry:` line

    def json(self) -> Any:
        return orjson.loads(self.data)


class LineDecoder:
    """Chunks in, whole lines out, without their ends (`\\r\\n`, `\\r` or `\\n`).

    A line still on its way is kept as the pieces that came and joined once its end
    arrives: joined at every chunk instead, a long line trickling in small chunks cost
    time in the square of its length."""

    __slots__ = ("_cr", "_partial", "_size")

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # the start of a line whose end has not arrived
        self._size = 0  # its length
        self._cr = False  # the last chunk ended with `\r`: a `\n` starting the next is its pair

    def feed(self, chunk: bytes) -> list[bytes]:
        if not chunk:
            return []
        if self._cr:
            self._cr = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if self._partial:
            if b"\n" not in chunk and b"\r" not in chunk:  # the line goes on
                self._partial.append(chunk)
                self._size += len(chunk)
                return []
            self._partial.append(chunk)
            chunk = b"".join(self._partial)
            self._partial, self._size = [], 0
        # bytes.splitlines splits at exactly `\r\n`, `\r` and `\n`, in C.
        lines = chunk.splitlines()
        last = chunk[-1]
        if last == _CR:
            self._cr = True
        elif last != _LF:
            tail = lines.pop()
            self._partial, self._size = [tail], len(tail)
        return lines

    @property
    def pending_size(self) -> int:
        """The length of a line whose end has not arrived yet."""
        return self._size

    def pending_head(self, length: int) -> bytes:
        """The first `length` bytes of a line whose end has not arrived yet."""
        head = b""
        for piece in self._partial:
            head += piece[: length - len(head)]
            if len(head) >= length:
                break
        return head

    def flush(self) -> list[bytes]:
        """The last line of a stream that ended without a line end."""
        partial = b"".join(self._partial)
        self._partial, self._size, self._cr = [], 0, False
        return [partial] if partial else []


def field(line: bytes) -> tuple[bytes, bytes]:
    """(name, value) of a non-empty line; a comment's name is empty. One space after the
    colon is not part of the value; a line without a colon is a name with an empty value."""
    name, _, value = line.partition(b":")
    if value[:1] == b" ":
        value = value[1:]
    return name, value


class SSEDecoder:
    """`feed` chunks in order and get the events they complete; `flush` at the end."""

    __slots__ = ("_data", "_event", "_id", "_lines", "_retry")

    def __init__(self) -> None:
        self._lines = LineDecoder()
        self._event = ""
        self._data: list[bytes] = []
        self._id = ""
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        return self.decode_lines(self._lines.feed(chunk))

    def flush(self) -> list[ServerSentEvent]:
        """The events a stream that broke off leaves: its last line, and an event its blank
        line never closed. The spec drops that event; after the fact it is still what the
        backend said, so readers of a finished body get it."""
        return self.decode_lines([*self._lines.flush(), b""])

    def decode_lines(self, lines: list[bytes]) -> list[ServerSentEvent]:
        """Lines without their ends, in order; the events they complete."""
        events = []
        data = self._data
        for line in lines:
            # The two commonest lines, `data: ...` and the blank line after it, inline.
            if line[:6] == b"data: ":
                data.append(line[6:])
            elif line:
                self._field(line)
            elif data:
                joined = data[0] if len(data) == 1 else b"\n".join(data)
                event = (self._event or "message", joined, self._id, self._retry)
                events.append(_new_event(ServerSentEvent, event))
                data = self._data = []
                self._event, self._retry = "", None
            else:  # no `data:` line: nothing to dispatch, as the spec says
                self._event, self._retry = "", None
        return events

    def _field(self, line: bytes) -> None:
        name, value = field(line)
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\0" not in value:  # as the spec says: such an id is ignored
                self._id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            self._retry = int(value)
        # A comment (empty name) or an unknown field is ignored.


def decode_all(body: bytes) -> list[ServerSentEvent]:
    """Every event of a whole body, including the last of one that broke off."""
    # A whole body needs no LineDecoder: every line is complete, the last one included.
    return SSEDecoder().decode_lines([*body.splitlines(), b""])


def json_objects(data: bytes) -> list[dict[str, Any]]:
    """The JSON object an event's data holds; `[DONE]` and non-objects give none.

    A server that ends events with one newline instead of two (against the spec) sends
    several objects as the lines of one event: each line is then read on its own."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        if b"\n" not in data:
            return []
        return [obj for line in data.split(b"\n") for obj in json_objects(line)]
    return [parsed] if isinstance(parsed, dict) else []


def sse_events(body: bytes) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, JSON data) for each event of a whole SSE body; `[DONE]` and data that
    are not JSON objects are skipped, so a stream that broke off still yields what arrived."""
    for name, data, _id, _retry in decode_all(body):
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            for each in json_objects(data):
                yield name, each
            continue
        if isinstance(parsed, dict):
            yield name, parsed


def sse_data(body: bytes) -> list[dict[str, Any]]:
    """The JSON objects of every event, in order (event names dropped).

    A fast path first: one regex pass and one orjson call over all the `data:` payloads
    joined into an array cost a fraction of a Python loop over lines and one call per
    event, and a long stream has hundreds. Whatever it cannot read (a malformed or
    multi-line event, `\\r` line ends) goes through the decoder."""
    payloads = sse_payloads(body)
    if not payloads:
        return []
    try:
        parsed = orjson.loads(b"[" + b",".join(payloads) + b"]")
    except orjson.JSONDecodeError:
        return [data for _event, data in sse_events(body)]
    return [item for item in parsed if isinstance(item, dict)]


# A `data:` line whose payload is a JSON object. A trailing `\r` (CRLF framing) stays in
# the match: JSON counts it as whitespace, and `.*` runs much faster than `[^\r\n]*`.
_DATA_OBJECT = re.compile(rb"^data:[ \t]*(\{.*)", re.MULTILINE)


def sse_payloads(body: bytes) -> list[bytes]:
    """The raw JSON object of every `data:` line, in order: the fast path for the framing
    OpenAI and vLLM use (a payload it cuts wrong fails to parse, and callers fall back)."""
    return _DATA_OBJECT.findall(body)


# The end of an event: a blank line (`\n\n`, `\r\n\r\n`). No event spans one, so a body
# cut after it is cut between events.
_EVENT_END = re.compile(rb"\n\r?\n")


def event_slices(body: bytes, size: int) -> Iterator[bytes]:
    """A whole body in slices of about `size` bytes (more when an event is longer), each
    cut after an event's blank line: what reads each slice on its own reads every event
    whole, as it would reading the body at once."""
    start = 0
    while start < len(body):
        found = _EVENT_END.search(body, start + size)
        end = len(body) if found is None else found.end()
        yield body[start:end]
        start = end
