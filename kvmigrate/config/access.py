"""Who checks a client's key, by config: the proxy (`server.master_key`), the primary (the
client's key passes through, and the primary vouches for it before a candidate sees a
request: proxy.client_keys), or nobody."""

from __future__ import annotations

import enum

from kvmigrate.config.model import Config


class AuthMode(enum.StrEnum):
    """Who checks a client's key. `master_key`: the proxy, against `server.master_key`.
    `pass_through`: the primary, which gets the client's own key; the candidate is reached
    only with a key the primary accepted. `open`: nobody; the primary gets the configured
    key, so anyone who reaches the proxy spends it."""

    MASTER_KEY = "master_key"
    PASS_THROUGH = "pass_through"
    OPEN = "open"


def auth_mode(config: Config) -> AuthMode:
    if config.server.master_key is not None:
        return AuthMode.MASTER_KEY
    primary = config.backends[config.rollout.primary]
    # A litellm primary is reached through a gateway that holds the provider's credentials.
    if primary.api_key is None and primary.type != "litellm":
        return AuthMode.PASS_THROUGH
    return AuthMode.OPEN


def describe_auth(config: Config) -> str:
    """One line for `config check` and the proxy's start-up banner."""
    mode = auth_mode(config)
    if mode is AuthMode.MASTER_KEY:
        return "auth: master_key (the proxy checks every client key against server.master_key)"
    if mode is AuthMode.PASS_THROUGH:
        ttl = config.server.client_key_ttl_seconds
        return (
            f"auth: pass_through (each client's key goes to the primary "
            f"{config.rollout.primary}, which checks it; a candidate serves or gets a copy "
            f"only of requests whose key the primary accepted, verdicts kept {ttl:g} s)"
        )
    return (
        "auth: open (no client key is checked: anyone who reaches the proxy uses the "
        "primary's configured key; set server.master_key unless the network is private)"
    )
