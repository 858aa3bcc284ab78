"""Chat completion chunks as an engine streams them, for upstreams that tests script."""

from __future__ import annotations

import json


def chat_chunk(delta: dict[str, str], finish: str | None = None, model: str = "m") -> bytes:
    """One `chat.completion.chunk` server-sent event."""
    body = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"
