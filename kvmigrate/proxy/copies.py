"""Copies of a served request, sent after the client has its answer: to each candidate
(shadow), and once more to the primary for the noise floor. Never waited for, bounded per
backend (proxy.shadow), always accounted: each copy's exchange goes to the addons."""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from kvmigrate.config import Config
from kvmigrate.proxy.addons import Addons
from kvmigrate.proxy.chained import ChainRouting
from kvmigrate.proxy.copy_usage import with_usage
from kvmigrate.proxy.exchange import NOISE, SHADOW, Exchange, Role
from kvmigrate.proxy.forward import Call, UpstreamFailure, drain, is_event_stream, open_response
from kvmigrate.proxy.metrics import ProxyMetrics
from kvmigrate.proxy.routed import Routed
from kvmigrate.proxy.shadow import RateBudget, candidate_dispatchers
from kvmigrate.proxy.unserved import UnservedRoutes
from kvmigrate.proxy.upstream import Upstreams
from kvmigrate.rollout.chains import ChainMap, ChainTurn
from kvmigrate.wire.anthropic import MESSAGES_ROUTES

# The service's own: the request's call to a backend, and a new exchange with it.
ModelCall = Callable[[web.Request, Routed, str], Call]
NewExchange = Callable[[Routed, str, Role, float], Exchange]


class Copies:
    """The copies of one proxy: its dispatchers (one per candidate), the noise budget, and
    what each copy needs of the service (its calls and exchanges)."""

    def __init__(
        self,
        config: Config,
        metrics: ProxyMetrics,
        chains: ChainMap,
        chained: ChainRouting,
        upstreams: Upstreams,
        addons: Addons,
        unserved: UnservedRoutes,
        model_call: ModelCall,
        new_exchange: NewExchange,
    ) -> None:
        self.chains, self.chained = chains, chained
        self.upstreams, self.addons = upstreams, addons
        self._model_call, self._new_exchange = model_call, new_exchange
        self.noise_budget = RateBudget(config.rollout.noise_per_minute / 60.0)
        self.unserved = unserved
        shadow_timeout = max(b.read_timeout for b in config.backends.values())
        self.shadow, self.shadows = candidate_dispatchers(config, metrics, shadow_timeout)

    async def close(self) -> None:
        await self.shadow.close()
        for dispatcher in self.shadows.values():
            await dispatcher.close()

    def mirror(self, request: web.Request, routed: Routed, exchange: Exchange) -> None:
        """After the client has its answer, so the copies cannot compete with it."""
        chosen = routed.route
        if not exchange.mirrored or chosen.shadow is None:
            return
        extra = chosen.extra_shadows(routed.served)
        for backend in (chosen.shadow, *extra):
            # With several candidates the chain map keeps each one's own response ids.
            owner = backend if extra else ""
            mirrors = self.chained.expect_mirror(exchange.chain, owner)
            sent = self._dispatch(request, routed, backend, SHADOW, exchange, mirrors, owner)
            if mirrors is not None and not sent:
                self.chains.mirrored(mirrors, None, owner)
        if chosen.noise and self.noise_budget.take():
            self._dispatch(request, routed, chosen.serve, NOISE, exchange)

    def _dispatch(
        self,
        request: web.Request,
        routed: Routed,
        backend: str,
        role: Role,
        primary: Exchange,
        mirrors: str | None = None,
        owner: str = "",
    ) -> bool:
        """A background copy of the request: to the candidate (shadow) or, for the noise
        floor, once more to the primary. Never waited for, bounded, always accounted.
        `primary`: the exchange of the answer the copy mirrors, finished. `mirrors`: that
        answer's response id (for `owner`, the candidate whose chain it continues; "": the
        model's only one)."""
        primary_id, primary_status = primary.request_id, primary.status
        # The copy is recorded in its answer's conversation, as that answer was: the
        # recorder pairs them within one lane, chosen by this key.
        in_store = primary.conversation_in_store
        call = self._model_call(request, routed, backend)

        async def copy() -> None:
            try:
                await send_copy()
            finally:
                if mirrors is not None:
                    self.chains.mirrored(mirrors, None, owner)  # no-op once its id is known

        async def send_copy() -> None:
            nonlocal call
            # In the task, after the client's answer. Anthropic streams always carry usage.
            if routed.path not in MESSAGES_ROUTES:
                call = with_usage(call, routed.body, routed.path)
            if role == SHADOW and routed.chain is not None:
                body = await self.chained.copy_body(call.body, routed.chain, owner)
                if body is None:
                    return
                call = Call(call.method, call.url, body, call.headers)
            exchange = self._new_exchange(routed, backend, role, time.perf_counter())
            exchange.pair_id = primary_id
            exchange.conversation_in_store = in_store
            if isinstance(exchange.chain, ChainTurn):
                exchange.chain.mirrors, exchange.chain.mirror_owner = mirrors, owner
            exchange.request_body = call.body
            upstream = self.upstreams[backend]
            try:
                response = await open_response(upstream, call)
            except UpstreamFailure as failure:
                exchange.error = failure.kind
            else:
                exchange.status = response.status
                event_stream = is_event_stream(response)
                await drain(response, exchange)
                if exchange.error is None and routed.route.is_candidate(backend):
                    exchange.error = self.unserved.copy_error(
                        exchange, event_stream, primary_status
                    )
            exchange.finished = exchange.finished or time.perf_counter()
            self.addons.exchange_done(exchange)

        # Without a chain to settle, no wrapper: a coroutine less per copy.
        return self.shadows.get(backend, self.shadow).dispatch(
            copy if mirrors is not None else send_copy
        )
