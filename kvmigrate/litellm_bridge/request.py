"""What the plugin reads of a LiteLLM proxy request: the route, the client's headers and body.

LiteLLM hands `async_pre_call_hook` its working `data` dict: the client's body fields plus
its own bookkeeping (`metadata` or `litellm_metadata`, `litellm_call_id`, the logging
object, `proxy_server_request` with the lower-cased client headers). These helpers pull the
client's view back out of it, so routing keys and shadow copies see what the client sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvmigrate.litellm_bridge.wire import CHAT_PARAMS, RESPONSES_PARAMS

# LiteLLM call types (`CallTypes` in litellm.types.utils) -> kvmigrate's route names.
ROUTES: dict[str, str] = {
    "acompletion": "chat/completions",
    "completion": "chat/completions",
    "aresponses": "responses",
    "responses": "responses",
    # LiteLLM's `/v1/messages` (Anthropic's Messages API), whatever provider serves it.
    "anthropic_messages": "messages",
}

# Anthropic's Messages API request fields a copy passes on. `metadata` stays out: the
# client's `user_id` keys the conversation (read from the client's body), and LiteLLM reads
# a `metadata` keyword as its own logging metadata.
MESSAGES_PARAMS = frozenset(
    {
        "messages",
        "max_tokens",
        "system",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "service_tier",
    }
)

# Keys LiteLLM adds to the request body; never part of what a backend should receive.
# `metadata` goes too: on chat routes LiteLLM owns it (the client's copy is kept inside it
# as `requester_metadata`); `client_metadata` finds the client's.
_INTERNAL_KEYS = frozenset(
    {
        "metadata",
        "litellm_metadata",
        "proxy_server_request",
        "secret_fields",
        "user_api_key_dict",
        "fallbacks",
    }
)


def route_of(call_type: object) -> str | None:
    """kvmigrate's route for a LiteLLM call type; None for calls the plugin leaves alone."""
    return ROUTES.get(call_type) if isinstance(call_type, str) else None


def request_headers(data: Mapping[str, Any]) -> Mapping[str, str]:
    """The client's request headers (lower-cased by LiteLLM), or {} outside the proxy."""
    request = data.get("proxy_server_request")
    if isinstance(request, Mapping):
        headers = request.get("headers")
        if isinstance(headers, Mapping):
            return headers
    for key in ("metadata", "litellm_metadata"):
        meta = data.get(key)
        if isinstance(meta, Mapping) and isinstance(meta.get("headers"), Mapping):
            found: Mapping[str, str] = meta["headers"]
            return found
    return {}


def client_body(data: Mapping[str, Any]) -> dict[str, Any]:
    """The request body as the client sent it, without LiteLLM's bookkeeping keys; with the
    client's own `metadata`, where it sent one (Anthropic's `user_id` names a conversation,
    a cohort may select by a key of it)."""
    request = data.get("proxy_server_request")
    source = request.get("body") if isinstance(request, Mapping) else None
    if not isinstance(source, Mapping):
        source = data
    body = {
        key: value
        for key, value in source.items()
        if key not in _INTERNAL_KEYS and not key.startswith(("litellm_", "_litellm"))
    }
    metadata = client_metadata(data)
    if metadata is not None:
        body["metadata"] = metadata
    return body


def client_metadata(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The client's `metadata`: LiteLLM keeps it as it came where its own goes under
    `litellm_metadata` (`/v1/messages`, `/v1/responses`), else inside its own
    `metadata` as `requester_metadata`."""
    meta = data.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    if "litellm_metadata" in data:
        return meta
    requester = meta.get("requester_metadata")
    return requester if isinstance(requester, Mapping) else None


# What a copy to another model group carries, by route: OpenAI's request fields only.
# LiteLLM reads other keywords as its settings (`extra_headers`, `api_key`, `api_base`, ...),
# and honours some of them from a client's body: passed on, a key the client meant for the
# hosted API would reach the candidate, and land in the records.
_FORWARDED = {
    "chat/completions": CHAT_PARAMS | {"model"},
    "responses": RESPONSES_PARAMS | {"model", "conversation"},
    "messages": MESSAGES_PARAMS | {"model"},
}


def forwarded_body(body: Mapping[str, Any], route: str) -> dict[str, Any]:
    """The client's body as a copy sends it and a record keeps it."""
    allowed = _FORWARDED.get(route, frozenset({"model"}))
    return {key: value for key, value in body.items() if key in allowed}


def call_id(data: Mapping[str, Any]) -> str | None:
    value = data.get("litellm_call_id")
    return value if isinstance(value, str) and value else None


def answered_group(response: object) -> str | None:
    """The model group whose deployment gave `response` (after LiteLLM's fallbacks), as
    LiteLLM's router stamps it on the answer; None when it did not."""
    hidden = getattr(response, "_hidden_params", None)
    extra = hidden.get("additional_headers") if isinstance(hidden, Mapping) else None
    group = extra.get("x-litellm-model-group") if isinstance(extra, Mapping) else None
    return group if isinstance(group, str) and group else None


def model_group(kwargs: Mapping[str, Any]) -> str | None:
    """The model group a finished call went to (after LiteLLM's own fallbacks), from the
    logging kwargs; None when LiteLLM did not say."""
    params = kwargs.get("litellm_params")
    if not isinstance(params, Mapping):
        return None
    for key in ("metadata", "litellm_metadata"):
        meta = params.get(key)
        if isinstance(meta, Mapping):
            group = meta.get("model_group")
            if isinstance(group, str) and group:
                return group
    return None
