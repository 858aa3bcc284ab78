"""Checking a candidate's answer on the way through, so garbage never reaches a client.

Only answers from the candidate are checked (the primary is the incumbent the clients already
live with), and only cheaply: a non-streamed body must parse as JSON, and each complete SSE
line must be a known field whose `data:` parses as JSON. A failure before the first byte
went out falls back to the primary; after it, the stream ends with an SSE error event.
"""

from __future__ import annotations

import orjson

_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")


class SseCheck:
    """Feed stream chunks in order; `feed` answers False at the first malformed line."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> bool:
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return all(_line_ok(line.rstrip(b"\r")) for line in lines)


def _line_ok(line: bytes) -> bool:
    if not line:
        return True
    if not line.startswith(_FIELDS):
        return False
    if not line.startswith(b"data:"):
        return True
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return True
    try:
        orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return True


def json_ok(body: bytes) -> bool:
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


def malformed_kind(body: bytes, event_stream: bool) -> str | None:
    """The error class of a whole answer that does not parse, or None when it does."""
    if event_stream:
        check = SseCheck()
        return None if check.feed(body + b"\n") else "malformed_stream"
    return None if json_ok(body) else "malformed_body"
