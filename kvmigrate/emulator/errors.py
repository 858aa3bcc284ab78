"""Errors that end a request with an HTTP status; each dialect renders them in its envelope."""

from __future__ import annotations

from collections.abc import Mapping


class EmulatorError(Exception):
    """An error answer.

    `code` is OpenAI's string code (`model_not_found`, ...); vLLM ignores it and reports the
    status number instead. `error_type` overrides the profile's default type for the status.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        vllm_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type
        self.headers = dict(headers or {})
        # vLLM words some errors differently; the vllm dialect prefers this text when set.
        self.vllm_message = vllm_message


def bad_request(message: str, param: str | None = None, code: str | None = None) -> EmulatorError:
    return EmulatorError(400, message, param=param, code=code)


def model_not_found(model: str) -> EmulatorError:
    return EmulatorError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
        vllm_message=f"The model `{model}` does not exist.",
    )


def unauthorized(supplied: str | None) -> EmulatorError:
    if not supplied:
        message = (
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
        return EmulatorError(401, message, code=None)
    shown = supplied[:3] + "*" * max(len(supplied) - 7, 0) + supplied[-4:]
    message = f"Incorrect API key provided: {shown}."
    return EmulatorError(401, message, code="invalid_api_key")
