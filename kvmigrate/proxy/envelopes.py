"""Which error shape a route's clients know, chosen here and nowhere else: Anthropic's on the
Messages routes (the anthropic SDKs read it), OpenAI's on every other route.

Three places use it: the error boundary (errors the proxy makes), the relay (the event that
ends a stream which broke after its first bytes) and the candidate's error answers (mapped
into the shape the primary's clients know; the record keeps the candidate's own bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvmigrate.proxy.errors import ProxyError, sse_error_event
from kvmigrate.wire import anthropic
from kvmigrate.wire.errors import openai_error_body


@dataclass(frozen=True, slots=True)
class Envelope:
    body: Callable[[ProxyError], bytes]
    # (message, error kind as records name it) -> the final SSE event of a broken stream
    stream_event: Callable[[str, str], bytes]
    # (status, body, route) -> a backend's error answer in this shape, None: relay as is
    backend_error: Callable[[int, bytes, str], bytes | None]


OPENAI = Envelope(
    body=ProxyError.body,
    stream_event=sse_error_event,
    backend_error=openai_error_body,
)
ANTHROPIC = Envelope(
    body=lambda error: anthropic.error_body(error.status, error.message),
    stream_event=lambda message, _kind: anthropic.error_event("api_error", message),
    backend_error=lambda status, body, _route: anthropic.anthropic_error_body(status, body),
)


def envelope_for(route: str) -> Envelope:
    """By route below /v1 (`messages`, `chat/completions`, ...)."""
    return ANTHROPIC if route in anthropic.MESSAGES_ROUTES else OPENAI


def envelope_for_path(path: str) -> Envelope:
    """By request path: Anthropic's below /v1/messages (its batches too, which pass
    through to the primary); OpenAI's anywhere else."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return ANTHROPIC
    return OPENAI
