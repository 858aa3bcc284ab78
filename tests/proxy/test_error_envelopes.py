"""Each proxy-made error, built alone: its status, and the exact bytes of its envelope."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from kvmigrate.proxy.errors import (
    ProxyError,
    bad_request,
    body_too_large,
    chain_not_served,
    chain_stranded,
    error_body,
    model_not_found,
    route_not_served,
    shown,
    sse_error_event,
    unauthorized,
    upstream_timeout,
    upstream_unreachable,
)

LONG = "m" * 300


def envelope(message: str, error_type: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


@pytest.mark.parametrize(
    ("make", "status", "expected"),
    [
        (
            lambda: bad_request("Missing `model`."),
            400,
            envelope("Missing `model`.", "invalid_request_error", None, None),
        ),
        (
            lambda: bad_request("Bad `n`.", "n", "invalid_value"),
            400,
            envelope("Bad `n`.", "invalid_request_error", "n", "invalid_value"),
        ),
        (
            lambda: unauthorized("Incorrect API key provided."),
            401,
            envelope(
                "Incorrect API key provided.", "invalid_request_error", None, "invalid_api_key"
            ),
        ),
        (
            lambda: model_not_found("gpt-x"),
            404,
            envelope(
                "The model `gpt-x` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model",
                "model_not_found",
            ),
        ),
        (
            lambda: model_not_found(LONG + "\x1b[2J"),
            404,
            envelope(
                f"The model `{'m' * 256}...` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model",
                "model_not_found",
            ),
        ),
        (
            lambda: model_not_found("a\r\nb"),
            404,
            envelope(
                "The model `a\\r\\nb` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model",
                "model_not_found",
            ),
        ),
        (
            lambda: route_not_served("messages", "claude-x", "azure"),
            400,
            envelope(
                "The model `claude-x` is also served by backend `azure`, whose API has no "
                "/v1/messages; kvmigrate relays each API as it is and never translates one "
                "into another.",
                "invalid_request_error",
                None,
                "unsupported_route",
            ),
        ),
        (
            lambda: route_not_served("chat/completions", LONG, "anthropic"),
            400,
            envelope(
                f"The model `{'m' * 256}...` is also served by backend `anthropic`, whose API "
                "has no /v1/chat/completions; kvmigrate relays each API as it is and never "
                "translates one into another.",
                "invalid_request_error",
                None,
                "unsupported_route",
            ),
        ),
        (
            lambda: body_too_large(1048576),
            413,
            envelope(
                "Request body exceeds the limit of 1048576 bytes.",
                "invalid_request_error",
                None,
                "request_too_large",
            ),
        ),
        (
            lambda: upstream_unreachable("vllm"),
            502,
            envelope(
                "Backend `vllm` could not be reached.", "server_error", None, "upstream_unreachable"
            ),
        ),
        (
            lambda: upstream_timeout("openai"),
            504,
            envelope(
                "Backend `openai` did not answer in time.", "server_error", None, "upstream_timeout"
            ),
        ),
        (
            lambda: chain_stranded(upstream_timeout("vllm"), "vllm"),
            504,
            envelope(
                "Backend `vllm` did not answer in time. This request continues a response "
                "stored on `vllm`, and no other backend holds it, so it was not sent "
                "elsewhere; retry later.",
                "server_error",
                None,
                "upstream_timeout",
            ),
        ),
        (
            lambda: chain_stranded(bad_request("Bad input.", "input", "bad_input"), "openai"),
            400,
            envelope(
                "Bad input. This request continues a response stored on `openai`, and no "
                "other backend holds it, so it was not sent elsewhere; retry later.",
                "invalid_request_error",
                None,
                "bad_input",
            ),
        ),
        (
            lambda: chain_not_served("vllm", "gpt-4o"),
            400,
            envelope(
                "The response this request continues is stored on backend `vllm`, which does "
                "not serve the model `gpt-4o`: continue it with the model that started it.",
                "invalid_request_error",
                "previous_response_id",
                "previous_response_not_served",
            ),
        ),
        (
            lambda: chain_not_served("vllm", LONG),
            400,
            envelope(
                "The response this request continues is stored on backend `vllm`, which does "
                f"not serve the model `{'m' * 256}...`: continue it with the model that "
                "started it.",
                "invalid_request_error",
                "previous_response_id",
                "previous_response_not_served",
            ),
        ),
    ],
)
def test_each_error_has_its_status_and_exact_envelope(
    make: Callable[[], ProxyError], status: int, expected: dict[str, Any]
) -> None:
    # Built in the test, not in the table: mutmut sees only what a test itself calls.
    error = make()
    assert error.status == status
    assert orjson.loads(error.body()) == expected
    assert str(error) == expected["error"]["message"]
    response = error.response()
    assert response.status == status
    assert response.content_type == "application/json"
    assert response.body == error.body()


def test_the_envelope_keys_every_field_even_when_null() -> None:
    assert error_body("boom", "server_error") == (
        b'{"error":{"message":"boom","type":"server_error","param":null,"code":null}}'
    )
    assert ProxyError(418, "teapot").body() == (
        b'{"error":{"message":"teapot","type":"invalid_request_error","param":null,"code":null}}'
    )


def test_a_response_carries_the_given_headers_and_body() -> None:
    error = upstream_unreachable("vllm")
    other = b'{"type":"error","error":{"type":"api_error","message":"x"}}'
    response = error.response({"Retry-After": "3"}, other)
    assert response.status == 502
    assert response.body == other
    assert response.headers["Retry-After"] == "3"
    assert response.content_type == "application/json"


def test_a_broken_stream_ends_with_an_error_event() -> None:
    assert sse_error_event("Backend `vllm` stopped.", "upstream_broken") == (
        b'data: {"error":{"message":"Backend `vllm` stopped.","type":"server_error",'
        b'"param":null,"code":"upstream_broken"}}\n\n'
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gpt-4o", "gpt-4o"),
        ("x" * 256, "x" * 256),
        ("x" * 257, "x" * 256 + "..."),
        ("a\x1bb", "a\\x1bb"),
    ],
)
def test_a_shown_value_is_printable_and_cut_at_256(value: str, expected: str) -> None:
    assert shown(value) == expected
