"""Checking a candidate's answer on the way through, so garbage never reaches a client.

Only answers from the candidate are checked (the primary is the incumbent the clients already
live with), and only cheaply: a model route answers 200 or an error status, an event stream
to a request that asked for one and JSON to one that did not; a non-streamed body must parse
as JSON, and each SSE line must be a known field whose `data:` parses as JSON (a line still
on its way must start as one). A failure before the first byte went out falls back to the
primary; after it, the stream ends with an SSE error event.
"""

from __future__ import annotations

from collections.abc import Generator

import orjson

from kvmigrate.policies.outcome import ErrorKind
from kvmigrate.wire.assemble import SLICE_BYTES
from kvmigrate.wire.sse import LineDecoder, event_slices, field

# Field names a line may have; the empty name is a comment's.
_KNOWN = frozenset({b"data", b"event", b"id", b"retry", b""})
_LONGEST_NAME = max(len(name) for name in _KNOWN)
# A line no end has closed after this many bytes is not an event: a stream's largest, a
# Responses `response.completed` that repeats the whole answer, is far smaller. Without a
# bound, a candidate streaming bytes with no line end would be buffered (and joined again
# at every chunk) to its end.
MAX_LINE_BYTES = 8 * 1024 * 1024


def framing_error(status: int | None, asked_to_stream: bool, event_stream: bool) -> str | None:
    """What a candidate's answer is, by its head alone, if it is no answer to the request:
    a status no model route answers with, or an event stream where JSON was asked for (or
    the other way round: the SDK reading a stream finds no events in a JSON body)."""
    if status is None or status >= 400:
        return None  # an error the candidate answers itself is judged as an error
    if status != 200:
        return ErrorKind.UNEXPECTED_STATUS
    if asked_to_stream and not event_stream:
        return ErrorKind.MALFORMED_STREAM
    if event_stream and not asked_to_stream:
        return ErrorKind.MALFORMED_BODY
    return None


class SseCheck:
    """Feed stream chunks in order; `feed` answers False at the first malformed line.

    Line by line, not event by event: a bad line is caught in the chunk that completes
    it, before that chunk is relayed, even when the event's blank line comes later."""

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines = LineDecoder()

    def feed(self, chunk: bytes) -> bool:
        lines = self._lines
        return all([_line_ok(line) for line in lines.feed(chunk)]) and _pending_ok(lines)

    def end(self) -> bool:
        """Whether the stream's last line, one that no line end closed, is well formed."""
        return all([_line_ok(line) for line in self._lines.flush()])


def _pending_ok(lines: LineDecoder) -> bool:
    """Whether a line still on its way can become a well-formed one: its field name so far
    must begin a known one, and it must not outgrow any event. Read without joining its
    pieces: this runs at every chunk of the line."""
    if lines.pending_size > MAX_LINE_BYTES:
        return False
    name, colon, _ = lines.pending_head(_LONGEST_NAME + 1).partition(b":")
    if colon:
        return name in _KNOWN
    return any([known.startswith(name) for known in _KNOWN])


def _line_ok(line: bytes) -> bool:
    if line[:6] == b"data: ":  # most lines: inline, as `field` would read it
        value = line[6:]
    elif not line:
        return True
    else:
        name, value = field(line)
        if name != b"data":
            return name in _KNOWN
    if value == b"[DONE]":
        return True
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        return value.strip() == b"[DONE]"
    return True


def _all_data_parses(body: bytes) -> bool:
    """True when every line of a whole stream is a `data: ` line of one JSON value, `[DONE]`
    or blank: the shape of nearly every answer, checked with one parse instead of one per
    line (a shadow copy's check was the proxy's largest cost per copy). Each payload is
    wrapped in its own array, so one that is not exactly one value (`1,2`, `1],[2`) changes
    the count and fails here. False is not a verdict: the caller checks line by line."""
    payloads = []
    for line in body.splitlines():
        if line[:6] == b"data: ":
            if line != b"data: [DONE]":
                payloads.append(line[6:])
        elif line:
            return False
    if not payloads:
        return True
    try:
        parsed = orjson.loads(b"[[" + b"],[".join(payloads) + b"]]")
    except orjson.JSONDecodeError:
        return False
    return len(parsed) == len(payloads) and all([len(one) == 1 for one in parsed])


def json_ok(body: bytes) -> bool:
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


def malformed_kind(body: bytes, event_stream: bool) -> str | None:
    """The error class of a whole answer that does not parse, or None when it does."""
    if event_stream and _all_data_parses(body):
        return None
    if event_stream:
        check = SseCheck()
        return None if check.feed(body) and check.end() else ErrorKind.MALFORMED_STREAM
    return None if json_ok(body) else ErrorKind.MALFORMED_BODY


def malformed_kind_sliced(body: bytes, event_stream: bool) -> Generator[None, None, str | None]:
    """`malformed_kind`, an event stream read a slice of whole events at a time (drive it
    with kvmigrate.slices): a long answer judged at once held the proxy's loop."""
    if not event_stream or len(body) <= SLICE_BYTES:
        return malformed_kind(body, event_stream)
    check = SseCheck()
    for events in event_slices(body, SLICE_BYTES):
        if not _all_data_parses(events) and not check.feed(events):
            return ErrorKind.MALFORMED_STREAM
        yield
    return None if check.end() else ErrorKind.MALFORMED_STREAM
