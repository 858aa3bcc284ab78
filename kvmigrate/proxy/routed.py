"""A request on a model route once it is routed: what the proxy decided, and on what."""

from __future__ import annotations

from dataclasses import dataclass

from kvmigrate.continuity.resolver import Identity
from kvmigrate.policies import Route
from kvmigrate.policies.chain import ChainRef
from kvmigrate.proxy.body import RequestBody


@dataclass(frozen=True, slots=True)
class Routed:
    """A validated request on a model route, with its routing facts."""

    path: str  # below /v1, e.g. "chat/completions"
    body: RequestBody
    conversation: str
    turn: int
    route: Route
    served: dict[str, str]
    identity: Identity
    chain: ChainRef | None = None  # the stored response or conversation a request continues
    cohort: str = ""
    # The keyed hash of the client's key where the primary must vouch for it before a
    # candidate sees the request (proxy.client_keys); None where the proxy checks keys
    # itself or nobody does.
    key: bytes | None = None
