"""SSE frames as the APIs write them: the one encoder every part that writes a stream uses
(the emulator, the proxy's own error events, the LiteLLM adapter and plugin)."""

from __future__ import annotations

DONE = b"data: [DONE]\n\n"  # OpenAI's end of a chat or completions stream


def data_frame(data: bytes) -> bytes:
    """An unnamed event (OpenAI chat and completions chunks)."""
    return b"data: " + data + b"\n\n"


def event_frame(event: str, data: bytes) -> bytes:
    """A named event (Responses and Anthropic Messages events, named by their `type`)."""
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"
