"""A candidate's error answer in the shape the primary's clients know: OpenAI's envelope.

vLLM answers errors with a numeric `code` (400) and a class name for `type`
("BadRequestError"), flat before v0.10.1 and nested under `error` since. OpenAI's SDKs and
the agents built on them branch on OpenAI's strings: an agent that summarises its history
on `code == "context_length_exceeded"` never does so behind a vLLM, and fails instead. The
client gets the mapped envelope; the record keeps the upstream's own bytes.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_CONTEXT_LENGTH = re.compile(
    r"maximum context length|max_model_len|maximum model length|context window|"
    r"prompt is too long|input is too long|too many tokens",
    re.IGNORECASE,
)
# The request field a context-length error names, per route.
_PROMPT_PARAM = {"chat/completions": "messages", "responses": "input", "completions": "prompt"}
_TYPE_BY_STATUS = {401: "invalid_request_error", 403: "invalid_request_error", 429: "requests"}


def read_error(body: bytes) -> tuple[dict[str, Any], dict[str, Any], object] | None:
    """(the JSON object, the object that holds the error's fields, the message if any) of
    an error answer, nested under `error` or flat; None when the body is no JSON object."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    fields: dict[str, Any] = error if isinstance(error, dict) else data
    # vLLM's authentication middleware answers a bare {"error": "Unauthorized"}.
    return data, fields, error if isinstance(error, str) else fields.get("message")


def openai_error_body(status: int, body: bytes, route: str) -> bytes | None:
    """The error answer `body` (status >= 400) in OpenAI's envelope, or None when it is
    already in it, or is not a JSON error we can read (then it is relayed as it came)."""
    found = read_error(body)
    if found is None:
        return None
    data, fields, message = found
    if not isinstance(message, str):
        return None
    error = data.get("error")
    code, kind, param = fields.get("code"), fields.get("type"), fields.get("param")
    if isinstance(error, dict) and _is_openai_type(kind) and not isinstance(code, int):
        return None
    mapped_code, mapped_param = _code(status, message, route)
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": _type(status),
                "param": param if isinstance(param, str) else mapped_param,
                "code": code if isinstance(code, str) else mapped_code,
            }
        }
    )


def _is_openai_type(kind: object) -> bool:
    return isinstance(kind, str) and (kind.endswith("_error") or kind == "requests")


def _type(status: int) -> str:
    if status >= 500:
        return "server_error"
    return _TYPE_BY_STATUS.get(status, "invalid_request_error")


def _code(status: int, message: str, route: str) -> tuple[str | None, str | None]:
    if status == 400 and _CONTEXT_LENGTH.search(message):
        return "context_length_exceeded", _PROMPT_PARAM.get(route)
    if status == 404 and "model" in message.lower():
        return "model_not_found", "model"
    if status == 401:
        return "invalid_api_key", None
    if status == 429:
        return "rate_limit_exceeded", None
    return None, None
