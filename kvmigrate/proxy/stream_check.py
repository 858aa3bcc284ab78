"""Checking a candidate's answer on the way through, so garbage never reaches a client.

Only answers from the candidate are checked (the primary is the incumbent the clients already
live with), and only cheaply: a non-streamed body must parse as JSON, and each complete SSE
line must be a known field whose `data:` parses as JSON. A failure before the first byte
went out falls back to the primary; after it, the stream ends with an SSE error event.
"""

from __future__ import annotations

import orjson

from kvmigrate.policies.outcome import ErrorKind
from kvmigrate.wire.sse import LineDecoder, field

# Field names a line may have; the empty name is a comment's.
_KNOWN = frozenset({b"data", b"event", b"id", b"retry", b""})


class SseCheck:
    """Feed stream chunks in order; `feed` answers False at the first malformed line.

    Line by line, not event by event: a bad line is caught in the chunk that completes
    it, before that chunk is relayed, even when the event's blank line comes later."""

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines = LineDecoder()

    def feed(self, chunk: bytes) -> bool:
        return all([_line_ok(line) for line in self._lines.feed(chunk)])

    def end(self) -> bool:
        """Whether the stream's last line, one that no line end closed, is well formed."""
        return all([_line_ok(line) for line in self._lines.flush()])


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
