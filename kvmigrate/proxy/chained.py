"""Responses API chains in the proxy: where a continued chain goes, what its exchanges carry
for the response-id map, and the candidate's own id a shadow copy continues.

The map is `kvmigrate.continuity.chains.ChainMap`; the routing rules are `policies.chain`. This
is the glue `ProxyService` calls, kept apart so the service stays about serving.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection

from kvmigrate.continuity.chains import ChainMap, ChainTurn
from kvmigrate.continuity.resolver import Identity
from kvmigrate.policies import Route
from kvmigrate.policies.chain import RESPONSE_PREFIX, ChainRef, stick, unknown_chain
from kvmigrate.proxy.body import RequestBody, with_previous_response
from kvmigrate.proxy.chain_context import ChainContext, ContextUnavailable
from kvmigrate.proxy.errors import chain_not_served
from kvmigrate.proxy.metrics import ProxyMetrics

log = logging.getLogger("kvmigrate.proxy.shadow")

RESPONSES = "responses"  # the Responses API's route below /v1: its requests form chains
RouteFor = Callable[[str, int, Collection[str]], Awaitable[Route]]


class ChainRouting:
    def __init__(self, chains: ChainMap, metrics: ProxyMetrics) -> None:
        self.chains = chains
        self.metrics = metrics
        self._unavailable = 0  # re-seeds given up: the first is logged

    async def route(
        self,
        ref: ChainRef,
        body: RequestBody,
        served: Collection[str],
        route_for: RouteFor,
        declared: str | None = None,
    ) -> tuple[Identity, Route]:
        """A request continuing a stored response goes where that response is stored,
        whatever the split or a pin says, and nowhere else if that backend fails."""
        identity, backend = await self.chains.identify(ref, declared)
        chosen = await route_for(identity.conversation, identity.turn, served)
        if backend is None:
            return identity, unknown_chain(chosen, served)
        if backend not in served:
            raise chain_not_served(backend, body.model)
        return identity, stick(chosen, backend)

    @staticmethod
    def turn(conversation: str, turn: int, body: RequestBody, ref: ChainRef | None) -> ChainTurn:
        """What an exchange on the Responses route carries for the map."""
        return ChainTurn(
            conversation,
            turn,
            stores=body.data.get("store") is not False,
            conversation_id=ref.conversation if ref else None,
        )

    def expect_shadow_id(self, chain: object, owner: str = "") -> str | None:
        """The primary's response id a shadow copy about to go out (to `owner`, "" for the
        model's only candidate) shadows: the next turn's copy will wait for the
        candidate's own id of this one."""
        primary_id = chain.response_id if isinstance(chain, ChainTurn) else None
        if primary_id is not None:
            self.chains.expect_shadow_id(primary_id, owner)
        return primary_id

    async def copy_body(
        self, body: bytes, ref: ChainRef, owner: str = "", context: ChainContext | None = None
    ) -> bytes | None:
        """A shadow copy's body continuing the candidate's own chain (its id for the turn
        the request continues, spliced in). Where the candidate has no such turn (shadowing
        started mid-chain, the previous copy was dropped or failed), the turn with its whole
        context read back through `context`, so the candidate's chain starts again here;
        None (the copy is skipped, and counted) where that cannot be read, or the chain is
        a Conversations API one."""
        own = await self.chains.shadow_id_of(ref.previous, owner) if ref.previous else None
        if own is not None:
            return with_previous_response(body, own)
        if ref.previous is not None and context is not None:
            try:
                stateless = await context.stateless_body(body, ref.previous)
            except ContextUnavailable as exc:
                self._unavailable += 1
                if self._unavailable == 1:
                    log.warning(
                        "a shadow copy could not re-seed the candidate's chain (%s): skipped; "
                        'kvmigrate_shadow_dropped_total{reason="no_candidate_chain"} counts '
                        "these",
                        exc,
                    )
            else:
                self.metrics.shadow_reseeded.inc()
                return stateless
        self.metrics.shadow_dropped.labels("no_candidate_chain").inc()
        return None

    async def stored_on(self, suffix: str, backends: Collection[str]) -> str | None:
        """For `GET /v1/responses/{id}` and its sub-resources: the backend that stored the
        response, when the map knows it (the primary answers the rest)."""
        if not suffix.startswith(RESPONSES + "/"):
            return None
        response_id = suffix.split("/")[1]
        entry = await self.chains.find(RESPONSE_PREFIX + response_id) if response_id else None
        return entry.backend if entry is not None and entry.backend in backends else None
