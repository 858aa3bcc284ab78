"""The id of a Responses API answer, read as early and as cheaply as it can be: a whole
body's top-level `id`, or a stream's first event (`response.created`), which carries the
response object with its id before any output. Only the first event of a stream is decoded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from kvmigrate.wire.assemble import is_sse
from kvmigrate.wire.sse import SSEDecoder


def response_id(chunks: Iterable[bytes]) -> str | None:
    """The answer's response id; None when the body is no response (an error, garbage)."""
    parts = list(chunks)
    head = b""
    for part in parts:  # what the body starts with, however it was cut
        head += part[:64]
        if len(head) >= 64:
            break
    if not is_sse(head):
        try:
            data = orjson.loads(b"".join(parts))
        except orjson.JSONDecodeError:
            return None
        return _id_of(data if isinstance(data, dict) else None)
    decoder = SSEDecoder()
    for chunk in parts:
        for event in decoder.feed(chunk):
            try:
                data = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(data, dict) and isinstance(data.get("response"), dict):
                return _id_of(data["response"])
    return None


def _id_of(response: dict[str, Any] | None) -> str | None:
    value = response.get("id") if response is not None else None
    return value if isinstance(value, str) and value else None
