"""Anthropic's Messages API on the wire: its routes, its error envelope and error event.

Errors: `{"type": "error", "error": {"type": ..., "message": ...}}`, the type fixed by the
HTTP status (docs.claude.com/en/api/errors). The anthropic SDKs pick their exception class
by status alone (`anthropic._error_classes.make_status_error`), so the status is what must be
right; the type is what agents log and branch on. A stream that fails after its 200 ends
with an `event: error` carrying the same object, which the SDKs raise as an APIStatusError.
See docs/wire-anthropic.md.
"""

from __future__ import annotations

from typing import Any

import orjson

from kvmigrate.wire.errors import read_error
from kvmigrate.wire.sse_frames import event_frame

# Routes below /v1 that speak the Messages API.
MESSAGES_ROUTES = frozenset({"messages", "messages/count_tokens"})
# The API version a caller without one of its own sends (an offline replay: the recorded
# request keeps its body, not its headers); Anthropic refuses a request without any.
DEFAULT_VERSION = "2023-06-01"

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
KNOWN_TYPES = frozenset(ERROR_TYPES.values())


def anthropic_model(name: str) -> dict[str, Any]:
    """GET /v1/models/{name} as Anthropic's API answers it (its ModelInfo)."""
    return {"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}


def anthropic_model_list(models: list[str]) -> dict[str, Any]:
    """GET /v1/models as Anthropic's API answers it (one page, no pagination)."""
    data = [anthropic_model(m) for m in models]
    first, last = (models[0], models[-1]) if models else (None, None)
    return {"data": data, "has_more": False, "first_id": first, "last_id": last}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status; other 4xx are invalid_request_error (as
    the API reference says), other 5xx api_error."""
    found = ERROR_TYPES.get(status)
    if found is not None:
        return found
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str) -> bytes:
    error = {"type": error_type(status), "message": message}
    return orjson.dumps({"type": "error", "error": error})


def error_event(kind: str, message: str) -> bytes:
    """The SSE event that ends a Messages stream which broke after its first bytes."""
    data = orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
    return event_frame("error", data)


def anthropic_error_body(status: int, body: bytes) -> bytes | None:
    """A backend's error answer (status >= 400) in Anthropic's envelope, or None when it is
    already in it or carries no message we can read (then it is relayed as it came).

    vLLM's /v1/messages answers `{"type": "error", "error": {"type": "BadRequestError", ...}}`
    (its exception class name), its auth middleware `{"error": "Unauthorized"}`, and FastAPI
    `{"detail": ...}`; OpenAI-style backends `{"error": {"message": ...}}`."""
    found = read_error(body)
    if found is None:
        return None
    data, fields, message = found
    message = data.get("detail") if message is None else message
    if not isinstance(message, str):
        return None
    if data.get("type") == "error" and fields.get("type") == error_type(status):
        return None
    return error_body(status, message)
