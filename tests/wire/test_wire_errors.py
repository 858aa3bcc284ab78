"""A candidate's error answers reach the client in OpenAI's envelope, with OpenAI's codes."""

from __future__ import annotations

import orjson
import pytest

from kvmigrate.wire.errors import openai_error_body

CONTEXT = (
    "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens "
    "(2000 in the messages, 100 in the completion). Please reduce the length of the messages "
    "or completion."
)


@pytest.mark.parametrize(
    ("status", "body", "route", "expected"),
    [
        # vLLM >= 0.10.1: nested, numeric code, class-name type
        (
            400,
            {"error": {"message": CONTEXT, "type": "BadRequestError", "param": None, "code": 400}},
            "chat/completions",
            (CONTEXT, "invalid_request_error", "messages", "context_length_exceeded"),
        ),
        # vLLM < 0.10.1: flat
        (
            400,
            {"object": "error", "message": CONTEXT, "type": "BadRequestError", "code": 400},
            "responses",
            (CONTEXT, "invalid_request_error", "input", "context_length_exceeded"),
        ),
        (
            404,
            {
                "error": {
                    "message": "The model `m` does not exist.",
                    "type": "NotFoundError",
                    "param": None,
                    "code": 404,
                }
            },
            "chat/completions",
            ("The model `m` does not exist.", "invalid_request_error", "model", "model_not_found"),
        ),
        (
            401,
            {"error": "Unauthorized"},
            "chat/completions",
            ("Unauthorized", "invalid_request_error", None, "invalid_api_key"),
        ),
        (
            429,
            {"error": {"message": "busy", "type": "TooManyRequests", "code": 429}},
            "completions",
            ("busy", "requests", None, "rate_limit_exceeded"),
        ),
        (
            503,
            {"error": {"message": "engine dead", "type": "ServiceUnavailable", "code": 503}},
            "chat/completions",
            ("engine dead", "server_error", None, None),
        ),
        # a plain 400 keeps no code rather than a number the SDK's users never compare with
        (
            400,
            {
                "error": {
                    "message": "bad temperature",
                    "type": "BadRequestError",
                    "param": "temperature",
                    "code": 400,
                }
            },
            "chat/completions",
            ("bad temperature", "invalid_request_error", "temperature", None),
        ),
        # a near miss: a long prompt that is not the context-length error
        (
            400,
            {
                "error": {
                    "message": "the tool schema is invalid",
                    "type": "BadRequestError",
                    "code": 400,
                }
            },
            "chat/completions",
            ("the tool schema is invalid", "invalid_request_error", None, None),
        ),
    ],
)
def test_vllm_errors_take_openais_shape(
    status: int, body: dict[str, object], route: str, expected: tuple[object, ...]
) -> None:
    mapped = openai_error_body(status, orjson.dumps(body), route)
    assert mapped is not None
    error = orjson.loads(mapped)["error"]
    assert (error["message"], error["type"], error["param"], error["code"]) == expected


@pytest.mark.parametrize(
    "body",
    [
        # already OpenAI's: relayed byte for byte
        b'{"error": {"message": "x", "type": "invalid_request_error", "param": null, "code": "context_length_exceeded"}}',
        b"not json",
        b"[1, 2]",
        b'{"detail": "no message here"}',
    ],
)
def test_what_is_already_openais_or_unreadable_is_left_alone(body: bytes) -> None:
    assert openai_error_body(400, body, "chat/completions") is None
