"""Responses API ids as LiteLLM's proxy hands them out, back to the id the upstream minted.

LiteLLM 1.108.7 wraps a Responses answer's id twice before a client sees it:

1. `resp_` + base64 of `litellm:custom_llm_provider:{provider};model_id:{deployment};
   response_id:{upstream id}` (`ResponsesAPIRequestUtils._build_responses_api_response_id`):
   the deployment (`model_info.id`) that stored it. LiteLLM decodes a `previous_response_id`
   back to the upstream id before it calls the deployment, and pins a chain to that
   deployment only within the model group the request names (`responses_api_deployment_check`).
2. With a master key (or `LITELLM_SALT_KEY`), its `ResponsesIDSecurity` hook encrypts that
   again, with a random nonce and the caller's user and team
   (`litellm_proxy:responses_api:response_id:{1.};user_id:...;team_id:...`): the same
   response shows a new id in every answer that carries it.

The plugin keys its response-id map by the upstream id, which every form of one response
shares, and reads the deployment from layer 1 to find a chain the map forgot. Layer 2 needs
the proxy's key, so only LiteLLM can remove it (`litellm_unwrap`); layer 1 is decoded here.
"""

from __future__ import annotations

import base64
import binascii
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

PREFIX = "resp_"
_PROVIDER = "litellm:custom_llm_provider:"
_MODEL_ID = "model_id:"
_RESPONSE_ID = "response_id:"


@dataclass(frozen=True, slots=True)
class ManagedId:
    """What a LiteLLM-encoded response id names: the deployment and the upstream's own id."""

    upstream: str
    model_id: str | None = None
    provider: str | None = None


def decode_managed(response_id: str) -> ManagedId:
    """Layer 1 undone; an id LiteLLM did not encode is its own upstream id."""
    if not response_id.startswith(PREFIX):
        return ManagedId(response_id)
    body = response_id[len(PREFIX) :]
    try:
        text = base64.b64decode(body + "=" * (-len(body) % 4), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return ManagedId(response_id)
    parts = text.split(";", 2)
    if len(parts) != 3 or not parts[0].startswith(_PROVIDER):
        return ManagedId(response_id)
    provider, model_id, upstream = parts
    if not model_id.startswith(_MODEL_ID) or not upstream.startswith(_RESPONSE_ID):
        return ManagedId(response_id)
    upstream = upstream[len(_RESPONSE_ID) :]
    if not upstream:
        return ManagedId(response_id)
    return ManagedId(
        upstream,
        model_id[len(_MODEL_ID) :] or None,
        provider[len(_PROVIDER) :] or None,
    )


def encode_managed(upstream: str, model_id: str, provider: str = "openai") -> str:
    """Layer 1 as LiteLLM writes it (tests build ids with it)."""
    text = f"{_PROVIDER}{provider};{_MODEL_ID}{model_id};{_RESPONSE_ID}{upstream}"
    return PREFIX + base64.b64encode(text.encode("utf-8")).decode("ascii")


def advertised_id(answer: object) -> str | None:
    """The response id a Responses answer or stream event carries (a stream's first event,
    `response.created`, carries the response object), as LiteLLM hands it out."""
    found = getattr(answer, "id", None)
    if isinstance(found, str) and found.startswith(PREFIX):
        return found
    nested = getattr(answer, "response", None)
    found = nested.get("id") if isinstance(nested, Mapping) else getattr(nested, "id", None)
    return found if isinstance(found, str) and found else None


Unwrap = Callable[[str], str]


def litellm_unwrap() -> Unwrap | None:
    """LiteLLM's own removal of layer 2 (identity on an id it did not encrypt); None outside
    a LiteLLM install that has it."""
    try:
        hook = importlib.import_module("litellm.proxy.hooks.responses_id_security")
    except ImportError:
        return None
    unwrap = getattr(hook, "decrypted_response_id", None)
    return unwrap if callable(unwrap) else None


class ResponseIds:
    """A client-facing id to what it names, with whatever LiteLLM offers for layer 2."""

    def __init__(self, unwrap: Unwrap | None = None) -> None:
        self._unwrap = unwrap

    def managed(self, response_id: str) -> ManagedId:
        decrypted = response_id
        if self._unwrap is not None and response_id.startswith(PREFIX):
            try:
                decrypted = self._unwrap(response_id)
            except Exception:  # LiteLLM's helper, on an id a client made up
                decrypted = response_id
        return decode_managed(decrypted if isinstance(decrypted, str) else response_id)

    def key(self, response_id: str) -> str:
        """The id the response-id map keys a response by."""
        return self.managed(response_id).upstream
