"""Server-sent events as the OpenAI-compatible APIs send them: parsed after the fact."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson


def sse_events(body: bytes) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """(event name, JSON data) for each event of a whole SSE body; `[DONE]` and lines that
    are not JSON objects are skipped, so a stream that broke off still yields what arrived.

    Chunks are joined before splitting because an upstream may cut an event anywhere."""
    event: str | None = None
    for raw in body.split(b"\n"):
        line = raw.rstrip(b"\r")
        if not line:
            event = None
        elif line.startswith(b"event:"):
            event = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            try:
                data = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            if isinstance(data, dict):
                yield event, data


def sse_data(body: bytes) -> list[dict[str, Any]]:
    """The JSON objects of every `data:` line, in order (event names dropped).

    One orjson call over all the events joined into an array costs a fraction of one call
    per event, and a long stream has hundreds; a malformed event falls back to one by one."""
    payloads = [
        line[5:].strip()
        for line in body.split(b"\n")
        if line.startswith(b"data:") and line[5:].lstrip().startswith(b"{")
    ]
    if not payloads:
        return []
    try:
        parsed = orjson.loads(b"[" + b",".join(payloads) + b"]")
    except orjson.JSONDecodeError:
        return [data for _event, data in sse_events(body)]
    return [item for item in parsed if isinstance(item, dict)]
