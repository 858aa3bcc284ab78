"""Responses API chains in the plugin: a continued chain goes to the model group that stored
it, whatever the split says, and its shadow copy continues the candidate's own chain.

LiteLLM pins a `previous_response_id` to its deployment only within the model group the
request names (kvmigrate.litellm_bridge.ids), and the plugin names the group: at a
split, a chain whose first turn the candidate stored would otherwise continue on the
primary, which has never seen the id. The map (kvmigrate.continuity.chains.ChainMap), the
routing rules (`policies.chain`) and what exchanges carry (`ChainTurn`) are the proxy's;
this is the glue for LiteLLM's ids and its router.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvmigrate.continuity.chains import ChainMap, ChainTurn
from kvmigrate.continuity.resolver import ContinuityResolver, Identity
from kvmigrate.litellm_bridge.ids import ResponseIds
from kvmigrate.policies import Route
from kvmigrate.policies.chain import (
    RESPONSE_PREFIX,
    ChainEntry,
    ChainRef,
    chain_ref,
    stick,
    unknown_chain,
)

RouteFor = Callable[[str, int], Awaitable[Route]]
GroupOf = Callable[[str], str | None]  # a deployment's id (`model_info.id`) -> its model group


@dataclass(frozen=True, slots=True)
class Chained:
    """A Responses request that continues stored state: what it continues, by the map's
    keys, and the deployment LiteLLM's id names (None: not a LiteLLM id)."""

    ref: ChainRef
    deployment: str | None


class PluginChains:
    def __init__(self, links: ContinuityResolver, ids: ResponseIds, group_of: GroupOf) -> None:
        self.ids = ids
        self.map = ChainMap(links, key_of=ids.key)
        self._group_of = group_of
        self.by_deployment = 0  # chains the map forgot, routed by the id's deployment

    def chained(self, body: Mapping[str, Any]) -> Chained | None:
        """What a Responses request continues, or None for a stateless one."""
        ref = chain_ref(body)
        if ref is None:
            return None
        if ref.previous is None:
            return Chained(ref, None)
        managed = self.ids.managed(ref.previous)
        return Chained(ChainRef(managed.upstream, ref.conversation), managed.model_id)

    async def route(
        self,
        chained: Chained,
        served: Mapping[str, str],
        route_for: RouteFor,
        declared: str | None = None,
    ) -> tuple[Identity, Route]:
        """The chain's conversation and turn, and a route to the backend that stores it,
        with no fallback (no other backend holds the chain)."""
        identity, backend = await self._stored_on(chained, declared, served)
        chosen = await route_for(identity.conversation, identity.turn)
        if backend is None or backend not in served:
            return identity, unknown_chain(chosen, served)
        return identity, stick(chosen, backend)

    async def _stored_on(
        self, chained: Chained, declared: str | None, served: Mapping[str, str]
    ) -> tuple[Identity, str | None]:
        """The map's answer; for a chain it forgot, the group of the deployment LiteLLM's
        id names (None: the id names none, or a group of no backend of the model)."""
        identity, backend = await self.map.identify(chained.ref, declared)
        if backend is None and chained.deployment is not None:
            backend = _backend_of(self._group_of(chained.deployment), served)
            self.by_deployment += backend is not None
        return identity, backend

    @staticmethod
    def turn(identity: Identity, body: Mapping[str, Any], chained: Chained | None) -> ChainTurn:
        """What the served exchange carries for the map."""
        conversation = chained.ref.conversation if chained is not None else None
        stores = body.get("store") is not False
        return ChainTurn(identity.conversation, identity.turn, stores, conversation)

    def seen(
        self, turn: ChainTurn, backend: str, advertised: str, owners: tuple[str, ...]
    ) -> dict[str, str | None]:
        """An answer's id, seen on its way to the client: LiteLLM logs the answer only after
        the client has it, and the next turn may come first. Kept in the map at once, with
        the copies to each of `owners` expected (the next turn's copy waits for them);
        returns what each copy shadows. The answer's end keeps it again, by the backend
        that did answer."""
        turn.response_id = self.ids.key(advertised)
        if turn.stores:
            self.map.keep(
                RESPONSE_PREFIX + turn.response_id,
                ChainEntry(turn.conversation, turn.turn, backend),
            )
        return {owner: self.expect_shadow_id(turn, owner) for owner in owners}

    def expect_shadow_id(self, served_turn: object, owner: str) -> str | None:
        """The map key of the answer a copy to `owner` is about to shadow; the next turn's
        copy waits for the candidate's own id of it."""
        primary = served_turn.response_id if isinstance(served_turn, ChainTurn) else None
        if primary is not None:
            self.map.expect_shadow_id(primary, owner)
        return primary

    def copy_turn(self, served_turn: object, shadows: str | None, owner: str) -> ChainTurn | None:
        if not isinstance(served_turn, ChainTurn):
            return None
        turn = ChainTurn(served_turn.conversation, served_turn.turn, served_turn.stores)
        turn.copy_of, turn.copy_owner = shadows, owner
        return turn

    async def copy_body(
        self, body: dict[str, Any], chained: Chained | None, shadows: str | None, owner: str
    ) -> dict[str, Any] | None:
        """The copy's body continuing the candidate's own chain; None where the candidate
        has no turn to continue (its copy of the turn before failed or was dropped, or
        shadowing began mid-chain): the copy is skipped, as is the proxy's where it cannot
        re-seed the chain (LiteLLM reads no stored turn back for the plugin)."""
        if chained is None:
            return body
        own = None
        if chained.ref.previous is not None:
            own = await self.map.shadow_id_of(chained.ref.previous, owner)
        if own is None:
            if shadows is not None:
                self.map.record_shadow_id(shadows, None, owner)  # this turn has no copy either
            return None
        return {**body, "previous_response_id": own}

    def not_sent(self, shadows: str | None, owner: str) -> None:
        if shadows is not None:
            self.map.record_shadow_id(shadows, None, owner)


def _backend_of(group: str | None, served: Mapping[str, str]) -> str | None:
    if group is None:
        return None
    return next((backend for backend, name in served.items() if name == group), None)


def router_group_of(router: Callable[[], Any]) -> GroupOf:
    """A deployment id's model group, as LiteLLM's router knows it."""

    def group_of(model_id: str) -> str | None:
        found = getattr(router(), "get_deployment", None)
        try:
            deployment = found(model_id=model_id) if callable(found) else None
        except Exception:  # LiteLLM raises on a deployment it cannot describe
            return None
        name = getattr(deployment, "model_name", None)
        return name if isinstance(name, str) else None

    return group_of
