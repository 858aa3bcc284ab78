"""OpenAI-style error envelopes, and the one exception type the proxy maps at its boundary."""

from __future__ import annotations

import orjson
from aiohttp import web

from kvmigrate.logtext import printable
from kvmigrate.wire.sse_frames import data_frame

JSON_CONTENT_TYPE = "application/json"
# A client's own value named in an error (a model, a key, a path) is cut to this: a model
# name of 100 KB would come back whole in the 404, and in every log that keeps it.
SHOWN_LIMIT = 256


def shown(value: str) -> str:
    """A client's value as an error message names it: printable and cut to `SHOWN_LIMIT`."""
    return printable(value, SHOWN_LIMIT)


class ProxyError(Exception):
    """An error the proxy answers itself, in OpenAI's envelope and with the right status."""

    def __init__(
        self,
        status: int,
        message: str,
        error_type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.code = code
        self.param = param

    def body(self) -> bytes:
        return error_body(self.message, self.error_type, self.code, self.param)

    def response(
        self, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> web.Response:
        """`body`: the error in another envelope than OpenAI's (see proxy.envelopes)."""
        return web.Response(
            status=self.status,
            body=self.body() if body is None else body,
            content_type=JSON_CONTENT_TYPE,
            headers=headers,
        )


def error_body(
    message: str, error_type: str, code: str | None = None, param: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    )


def sse_error_event(message: str, code: str) -> bytes:
    """A final SSE event for a stream that broke after bytes reached the client.

    The OpenAI SDKs raise an APIError when a stream event carries an `error` object, so the
    client sees a failure instead of a silently truncated answer.
    """
    return data_frame(error_body(message, "server_error", code))


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ProxyError:
    return ProxyError(400, message, "invalid_request_error", code, param)


def unauthorized(message: str) -> ProxyError:
    return ProxyError(401, message, "invalid_request_error", "invalid_api_key")


def model_not_found(model: str) -> ProxyError:
    return ProxyError(
        404,
        f"The model `{shown(model)}` does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
        "model",
    )


def route_not_served(route: str, model: str, backend: str) -> ProxyError:
    """A model mapped to a backend whose API has no such route: an Anthropic Messages
    request to Azure, a chat request to Anthropic. Refused whichever backend the request
    would be routed to, so a conversation does not work at 0% and fail at 50%."""
    return ProxyError(
        400,
        f"The model `{shown(model)}` is also served by backend `{backend}`, whose API has no "
        f"/v1/{route}; kvmigrate relays each API as it is and never translates one into "
        "another.",
        "invalid_request_error",
        "unsupported_route",
    )


def body_too_large(limit: int) -> ProxyError:
    return ProxyError(
        413,
        f"Request body exceeds the limit of {limit} bytes.",
        "invalid_request_error",
        "request_too_large",
    )


def upstream_unreachable(backend: str) -> ProxyError:
    return ProxyError(
        502, f"Backend `{backend}` could not be reached.", "server_error", "upstream_unreachable"
    )


def upstream_timeout(backend: str) -> ProxyError:
    return ProxyError(
        504, f"Backend `{backend}` did not answer in time.", "server_error", "upstream_timeout"
    )


def chain_stranded(failure: ProxyError, backend: str) -> ProxyError:
    """A continued Responses chain whose backend failed: no other backend holds its state,
    so it is not retried elsewhere, where it would get a 404 or an answer without history."""
    return ProxyError(
        failure.status,
        f"{failure.message} This request continues a response stored on `{backend}`, and no "
        "other backend holds it, so it was not sent elsewhere; retry later.",
        failure.error_type,
        failure.code,
    )


def chain_not_served(backend: str, model: str) -> ProxyError:
    return ProxyError(
        400,
        f"The response this request continues is stored on backend `{backend}`, which does "
        f"not serve the model `{shown(model)}`: continue it with the model that started it.",
        "invalid_request_error",
        "previous_response_not_served",
        "previous_response_id",
    )
