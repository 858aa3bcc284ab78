"""Backend kinds: how the proxy reaches one kind of API.

Each kind builds the URL of a route, carries the backend's own key the way that API reads
it, and names the URL a readiness probe asks. Everything kind-specific lives here, so the
forwarding code has no `if type == ...`: httpx's one-transport-per-kind is the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from kvmigrate.config import BackendConfig, Secret
from kvmigrate.wire.anthropic import MESSAGES_ROUTES


class BackendKind:
    """An OpenAI-compatible API (OpenAI itself, vLLM, most gateways): the base of the others.

    `via_gateway`: the proxy cannot call it over HTTP itself and reaches it through a
    loopback gateway that speaks OpenAI's wire format (kvmigrate.litellm_bridge.gateway).
    """

    via_gateway = False
    # Where this API's own SDK looks for its key: what a tool calling the backend directly
    # (parity replay) may fall back on. Never another provider's variable.
    key_env: str | None = "OPENAI_API_KEY"

    def url(self, base: str, path: str, deployment: str | None = None) -> str:
        """The URL of `path` (below /v1, already checked) on one replica's `base`."""
        return base + "/" + path

    def auth_headers(self, key: Secret) -> dict[str, str]:
        """The headers that carry the backend's own key."""
        return {"Authorization": "Bearer " + key.reveal()}

    def probe_url(self, base: str) -> str:
        """A cheap call that proves the backend is up: its model list."""
        return base + "/models"

    def serves(self, route: str) -> bool:
        """Whether this API answers the model `route` (below /v1). An OpenAI-compatible
        server may serve Anthropic's Messages routes too (vLLM does); whether it does is
        known only when it answers."""
        return True


@dataclass(frozen=True, slots=True)
class AzureKind(BackendKind):
    """Azure OpenAI: the deployment is in the path, the API version in the query, and the
    key in `api-key`."""

    api_version: str
    key_env = "AZURE_OPENAI_API_KEY"

    def url(self, base: str, path: str, deployment: str | None = None) -> str:
        if deployment is None:
            return base + "/" + path
        return (
            f"{base}/openai/deployments/{quote(deployment, safe='')}/{path}"
            f"?api-version={quote(self.api_version, safe='')}"
        )

    def auth_headers(self, key: Secret) -> dict[str, str]:
        return {"api-key": key.reveal()}

    def probe_url(self, base: str) -> str:
        return f"{base}/openai/models?api-version={quote(self.api_version, safe='')}"

    def serves(self, route: str) -> bool:
        return route not in MESSAGES_ROUTES


class LiteLLMKind(BackendKind):
    """A provider called through litellm: served to the proxy by a loopback gateway in
    OpenAI's wire format (kvmigrate.litellm_bridge.gateway)."""

    via_gateway = True
    key_env = None  # the gateway holds the provider's credentials

    def serves(self, route: str) -> bool:
        # The gateway speaks OpenAI's wire: a Messages request would be translated.
        return route not in MESSAGES_ROUTES


class AnthropicKind(BackendKind):
    """Anthropic's API: the key in `x-api-key`; `anthropic-version` and `anthropic-beta`
    come from the client and pass through (headers.upstream_headers). It serves only the
    Messages routes: a chat request is never translated into one."""

    key_env = "ANTHROPIC_API_KEY"

    def auth_headers(self, key: Secret) -> dict[str, str]:
        return {"x-api-key": key.reveal()}

    def serves(self, route: str) -> bool:
        return route in MESSAGES_ROUTES


_KINDS: dict[str, Callable[[BackendConfig], BackendKind]] = {
    "openai": lambda _backend: BackendKind(),
    "azure": lambda backend: AzureKind(backend.api_version or ""),
    "litellm": lambda _backend: LiteLLMKind(),
    "anthropic": lambda _backend: AnthropicKind(),
}


def kind_of(backend: BackendConfig) -> BackendKind:
    """The kind of a configured backend (the config loader admits only known types)."""
    return _KINDS[backend.type](backend)
