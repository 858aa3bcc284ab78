"""What the plugin reads of a LiteLLM proxy request: the route, the client's headers and body.

LiteLLM hands `async_pre_call_hook` its working `data` dict: the client's body fields plus
its own bookkeeping (`metadata` or `litellm_metadata`, `litellm_call_id`, the logging
object, `proxy_server_request` with the lower-cased client headers). These helpers pull the
client's view back out of it, so routing keys and shadow copies see what the client sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# LiteLLM call types (`CallTypes` in litellm.types.utils) -> kvmigrate's route names.
ROUTES: dict[str, str] = {
    "acompletion": "chat/completions",
    "completion": "chat/completions",
    "aresponses": "responses",
    "responses": "responses",
}

# Keys LiteLLM adds to the request body; never part of what a backend should receive.
# `metadata` goes too: on chat routes LiteLLM owns it (the client's copy is kept inside it
# as `requester_metadata`), and a copy to the candidate does not need the client's.
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
    """The request body as the client sent it, without LiteLLM's bookkeeping keys."""
    request = data.get("proxy_server_request")
    source = request.get("body") if isinstance(request, Mapping) else None
    if not isinstance(source, Mapping):
        source = data
    return {
        key: value
        for key, value in source.items()
        if key not in _INTERNAL_KEYS and not key.startswith(("litellm_", "_litellm"))
    }


def call_id(data: Mapping[str, Any]) -> str | None:
    value = data.get("litellm_call_id")
    return value if isinstance(value, str) and value else None


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
