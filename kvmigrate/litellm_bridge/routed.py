"""What the plugin keeps of one LiteLLM call between its hooks, and the exchanges made of it.

The pre-call hook decides (`Routed`); the answer and each failed attempt, logged later, and
the copies made after the answer are recorded as kvmigrate's `Exchange`s of that decision.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.continuity.chains import ChainTurn
from kvmigrate.continuity.resolver import Identity
from kvmigrate.litellm_bridge.chains import Chained
from kvmigrate.policies import Route
from kvmigrate.proxy.exchange import SERVE, Exchange, Role


@dataclass(slots=True)
class Routed:
    """What the pre-call hook decided for one request, kept until LiteLLM logs its end."""

    path: str
    model: str
    conversation: str
    turn: int
    stream: bool
    route: Route
    served: dict[str, str]
    body: dict[str, Any]
    identity: Identity
    cohort: str = ""
    # LiteLLM logs each attempt (its retries, its fallback) under the one call id: each
    # failed attempt is a record of its own, numbered; the answer keeps the call's id.
    attempts: int = 0
    has_shadow_copy: bool = False  # copies go out once per request, whatever LiteLLM retried
    # Candidate refusals (4xx) held until the fallback's outcome says whose they are.
    refused: list[Exchange] = field(default_factory=list)
    chained: Chained | None = None  # a Responses request continuing stored state
    chain: ChainTurn | None = None  # a Responses request's place in its chain
    # What each candidate's copy shadows, once the answer's id went by (PluginCopies.seen).
    copy_of: dict[str, str | None] | None = None


def exchange_of(routed: Routed, backend: str, role: Role, request_id: str) -> Exchange:
    """An exchange of `routed` with `backend` in `role`, started now."""
    return Exchange(
        request_id=request_id,
        route=routed.path,
        backend=backend,
        role=role,
        model=routed.model,
        served_model=routed.served.get(backend, ""),
        conversation=routed.conversation,
        turn=routed.turn,
        stream=routed.stream,
        started=time.perf_counter(),
        identity=routed.identity.source,
        cohort=routed.cohort,
        continuity=routed.identity.pending if role == SERVE else None,
        chain=routed.chain if role == SERVE else None,
    )
