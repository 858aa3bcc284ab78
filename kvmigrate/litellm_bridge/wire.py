"""Between the OpenAI wire format and litellm's calls: request fields in, JSON and errors out.

Only OpenAI's own request parameters reach litellm. litellm reads many other keyword
arguments as its settings (`api_base`, `aws_role_name`, `vertex_credentials`, callback hosts,
...), so passing a client's body through as it is would let a client send the backend's
credentials to a host of its choosing. Backend settings come from the config alone.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from kvmigrate.config import BackendConfig, Secret
from kvmigrate.proxy.errors import ProxyError

log = logging.getLogger("kvmigrate.litellm_bridge.gateway")

# OpenAI's request fields, by route (as of 2025). A field not listed here is dropped.
_SAMPLING = frozenset(
    {
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "user",
    }
)
CHAT_PARAMS = _SAMPLING | frozenset(
    {
        "messages",
        "audio",
        "function_call",
        "functions",
        "max_completion_tokens",
        "modalities",
        "parallel_tool_calls",
        "prediction",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "service_tier",
        "store",
        "tool_choice",
        "tools",
        "top_logprobs",
        "verbosity",
        "web_search_options",
    }
)
COMPLETION_PARAMS = _SAMPLING | frozenset({"prompt", "best_of", "echo", "suffix"})
EMBEDDING_PARAMS = frozenset({"input", "dimensions", "encoding_format", "user"})
RESPONSES_PARAMS = frozenset(
    {
        "input",
        "include",
        "instructions",
        "max_output_tokens",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "stream",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
    }
)


@dataclass(frozen=True, slots=True)
class Route:
    """One OpenAI route and the litellm coroutine that serves it."""

    function: str  # e.g. "acompletion"
    params: frozenset[str]  # the request fields passed on
    named_events: bool = False  # the Responses API: `event:` lines, and no `[DONE]`


ROUTES = {
    "chat/completions": Route("acompletion", CHAT_PARAMS),
    "completions": Route("atext_completion", COMPLETION_PARAMS),
    "embeddings": Route("aembedding", EMBEDDING_PARAMS),
    "responses": Route("aresponses", RESPONSES_PARAMS, named_events=True),
}

_ERROR_CODES = {
    401: "invalid_api_key",
    404: "not_found",
    408: "request_timeout",
    429: "rate_limit_exceeded",
}


class LiteLLMError(ProxyError):
    """A failure litellm reported, with the headers worth relaying (Retry-After)."""

    def __init__(self, status: int, message: str, code: str | None, param: str | None) -> None:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        super().__init__(status, message, kind, code, param)
        self.headers: dict[str, str] = {}


def backend_kwargs(backend: BackendConfig) -> dict[str, Any]:
    """What every call of this backend passes to litellm: its credentials and settings."""
    kwargs: dict[str, Any] = {"timeout": backend.read_timeout}
    kwargs.update({key: reveal(value) for key, value in backend.litellm_params.items()})
    if backend.api_bases:
        kwargs["api_base"] = backend.api_base
    if backend.api_key is not None:
        kwargs["api_key"] = backend.api_key.reveal()
    if backend.api_version:
        kwargs["api_version"] = backend.api_version
    return kwargs


def backend_secrets(backend: BackendConfig) -> tuple[str, ...]:
    """The secret strings of a backend, to scrub from error messages."""
    key = [backend.api_key.reveal()] if backend.api_key is not None else []
    return tuple(s for s in [*key, *_secret_values(backend.litellm_params)] if s)


def _secret_values(value: object) -> Iterator[str]:
    if isinstance(value, Secret):
        yield value.reveal()
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _secret_values(item)
    elif isinstance(value, list):
        for item in value:
            yield from _secret_values(item)


def reveal(value: object) -> object:
    if isinstance(value, Secret):
        return value.reveal()
    if isinstance(value, Mapping):
        return {key: reveal(item) for key, item in value.items()}
    if isinstance(value, list):
        return [reveal(item) for item in value]
    return value


def call_kwargs(
    route: Route, data: Mapping[str, Any], backend: Mapping[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of one litellm call: the request's OpenAI fields, then the
    backend's settings, which a request cannot override."""
    kwargs = {key: value for key, value in data.items() if key in route.params}
    kwargs.pop("stream", None)
    if data.get("stream") is True and "stream" in route.params:
        kwargs["stream"] = True
    kwargs.update(backend)
    kwargs["model"] = data["model"]
    return kwargs


def openai_dict(result: object) -> dict[str, Any]:
    """A litellm answer or stream chunk as OpenAI's JSON object, without litellm's own fields."""
    dump = getattr(result, "model_dump", None)
    data = dump(mode="json", warnings=False) if callable(dump) else result
    if not isinstance(data, dict):
        raise TypeError(f"litellm returned {type(result).__name__}, not an OpenAI object")
    return _openai_shape(data)


def to_json(result: object) -> bytes:
    return orjson.dumps(openai_dict(result))


def _openai_shape(data: dict[str, Any]) -> dict[str, Any]:
    for key in [k for k in data if k.startswith("_")]:
        del data[key]
    data.pop("provider_specific_fields", None)
    for key in ("citations", "moderation"):
        if key in data and data[key] is None:
            del data[key]
    usage = data.get("usage")
    if isinstance(usage, dict):
        usage.pop("cost", None)  # litellm's price estimate
    choices = data.get("choices")
    if not isinstance(choices, list):
        return data
    for choice in choices:
        if isinstance(choice, dict):
            choice.pop("provider_specific_fields", None)
            for part in ("message", "delta"):
                if isinstance(choice.get(part), dict):
                    choice[part].pop("provider_specific_fields", None)
    # OpenAI's usage chunk has no choices; litellm adds an empty one.
    if data.get("usage") and choices and all(_empty_choice(c) for c in choices):
        data["choices"] = []
    return data


def _empty_choice(choice: object) -> bool:
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict) and any(v is not None for v in delta.values()):
        return False
    return choice.get("text") is None and "message" not in choice


def error_from(exc: BaseException, backend: str, secrets: Iterable[str]) -> LiteLLMError:
    """An exception from litellm as an OpenAI error, with the status litellm gave it.

    litellm's exceptions carry `status_code` (400, 401, 404, 408, 429, 500, 503, ...).
    Anything else is a failure of litellm itself: logged here, and a bare 500 for the client,
    never a traceback."""
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int) or not 400 <= status <= 599:
        log_scrubbed(f"backend {backend}: litellm raised", exc, secrets)
        message = f"Backend `{backend}` (litellm) failed: {type(exc).__name__}."
        return LiteLLMError(500, message, "upstream_error", None)
    message = scrub(str(getattr(exc, "message", None) or exc), secrets)
    param = getattr(exc, "param", None)
    code = _ERROR_CODES.get(status, "upstream_error" if status >= 500 else None)
    error = LiteLLMError(status, message, code, param if isinstance(param, str) else None)
    retry_after = _header(exc, "retry-after")
    if retry_after:
        error.headers["Retry-After"] = retry_after
    log.info("backend %s: litellm answered %d", backend, status)
    return error


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def log_scrubbed(what: str, exc: BaseException, secrets: Iterable[str]) -> None:
    """An error and its traceback, logged with the configured secrets masked: a provider
    SDK's exception may quote the credentials it was given."""
    trace = "".join(traceback.format_exception(exc))
    log.error("%s\n%s", what, scrub(trace, secrets))


def _header(exc: BaseException, name: str) -> str | None:
    for source in (getattr(exc, "litellm_response_headers", None), getattr(exc, "headers", None)):
        getter = getattr(source, "get", None)
        value = getter(name) if callable(getter) else None
        if isinstance(value, str) and value:
            return value
    return None
