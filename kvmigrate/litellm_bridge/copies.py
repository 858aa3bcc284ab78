"""The plugin's copies of an answered request, as kvmigrate's proxy makes them: one to each
candidate serving the model (a shadow copy) and, for the noise sample, one more to the
primary; a Responses turn's copy continues that candidate's own chain.

The copies go through LiteLLM's router (kvmigrate.litellm_bridge.shadow); the chain
map's side is kvmigrate.litellm_bridge.chains.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from kvmigrate.config import Config
from kvmigrate.exchange import Exchange
from kvmigrate.litellm_bridge.chains import PluginChains
from kvmigrate.litellm_bridge.ids import advertised_id
from kvmigrate.litellm_bridge.request import answered_group
from kvmigrate.litellm_bridge.routed import Routed, exchange_of
from kvmigrate.litellm_bridge.shadow import RouterSource, ShadowCopies, copy_id
from kvmigrate.proxy.exchange import NOISE, SHADOW, Role
from kvmigrate.proxy.shadow import RateBudget
from kvmigrate.proxy.unserved import UnservedRoutes, blame

Record = Callable[[Exchange], None]


class PluginCopies:
    def __init__(
        self,
        config: Config,
        chains: PluginChains,
        router: RouterSource,
        record: Record,
        unserved: UnservedRoutes,
    ) -> None:
        self.chains = chains
        self.unserved = unserved
        self._record = record
        timeout = max((b.read_timeout for b in config.backends.values()), default=600.0)
        concurrency = config.rollout.shadow_max_concurrency
        self.shadows = ShadowCopies(router, self._copied, concurrency, timeout)
        self.noise_budget = RateBudget(config.rollout.noise_per_minute / 60.0)

    def seen(self, routed: Routed, answer: object) -> bool:
        """A Responses answer (or its stream's first event) on its way to the client: its id
        goes into the chain map now (see PluginChains.seen). True once it has."""
        if routed.chain is None or routed.copy_of is not None:
            return True
        advertised = advertised_id(answer)
        if advertised is None:
            return False
        chosen = routed.route
        # A whole answer names its model group: after LiteLLM's fallback, the primary's,
        # and an answer of the fallback earns no copies. A stream's event names none.
        group = answered_group(answer)
        backend = next((b for b, g in routed.served.items() if g == group), chosen.serve)
        extra = chosen.extra_shadows(routed.served)
        shadows = (chosen.shadow, *extra) if chosen.shadow and backend == chosen.serve else ()
        owners = tuple(candidate if extra else "" for candidate in shadows)
        routed.copy_of = self.chains.seen(routed.chain, backend, advertised, owners)
        return True

    def none(self, routed: Routed) -> None:
        """The copies expected when the answer went by, which will not go."""
        for owner, shadows in (routed.copy_of or {}).items():
            self.chains.not_sent(shadows, owner)
        routed.copy_of = {}

    def send(self, routed: Routed, primary: Exchange) -> None:
        """Copies to each candidate serving the model, and the noise sample."""
        chosen = routed.route
        assert chosen.shadow is not None
        extra = chosen.extra_shadows(routed.served)
        expected = routed.copy_of or {}
        for backend in (chosen.shadow, *extra):
            owner = backend if extra else ""  # the map keeps each candidate's ids apart
            if owner in expected:
                shadows = expected.pop(owner)
            else:
                shadows = self.chains.expect_shadow_id(primary.chain, owner)
            if not self._copy(routed, backend, SHADOW, primary, shadows, owner):
                self.chains.not_sent(shadows, owner)
        if chosen.noise and self.noise_budget.take():
            self._copy(routed, primary.backend, NOISE, primary)

    def _copy(
        self,
        routed: Routed,
        backend: str,
        role: Role,
        primary: Exchange,
        shadows: str | None = None,
        owner: str = "",
    ) -> bool:
        group = routed.served.get(backend)
        if group is None:
            return False
        exchange = exchange_of(routed, backend, role, copy_id())
        exchange.chain = self.chains.copy_turn(primary.chain, shadows, owner) if shadows else None
        exchange.pair_id = primary.request_id
        # Recorded in its answer's conversation: the recorder pairs them within one lane.
        exchange.conversation_in_store = primary.conversation_in_store
        exchange.request_body = primary.request_body
        judge = None
        if routed.route.is_candidate(backend):
            judge = partial(self._judge, primary_status=primary.status)
        prepare = None
        if role == SHADOW and routed.chained is not None:
            chained = routed.chained
            prepare = partial(self.chains.copy_body, chained=chained, shadows=shadows, owner=owner)
        return self.shadows.dispatch(exchange, group, routed.body, judge, prepare)

    def _copied(self, exchange: Exchange) -> None:
        self.chains.map.exchange_done(exchange)  # a shadow copy's own id, for the next turn
        self._record(exchange)

    def _judge(self, copy: Exchange, primary_status: int | None) -> None:
        """A candidate's refusal of a copy, judged as the proxy judges one: `rejected`
        (against the candidate) where the primary answered the same request. As `http_4xx`
        it read as the client's fault, and LiteLLM deployments' shadow evidence never
        showed a candidate whose context window refused the long prompts."""
        kind = self.unserved.refusal(copy.backend, copy.route, copy.status)
        copy.error = blame(kind, primary_status) or copy.error

    async def close(self) -> None:
        await self.shadows.close()
