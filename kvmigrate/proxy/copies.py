"""Copies of a served request, sent after the client has its answer: to each candidate
(shadow), and once more to the primary for the noise floor. Never waited for, bounded per
backend (proxy.shadow), always accounted: each copy's exchange goes to the addons."""

from __future__ import annotations

import time

from aiohttp import web

from kvmigrate.config import Config
from kvmigrate.continuity.chains import ChainMap, ChainTurn
from kvmigrate.proxy.addons import Addons
from kvmigrate.proxy.calls import Calls
from kvmigrate.proxy.chain_context import ChainContext
from kvmigrate.proxy.chained import ChainRouting
from kvmigrate.proxy.client import Response, ServerDisconnected, UpstreamError
from kvmigrate.proxy.copy_flight import CopyFlight
from kvmigrate.proxy.copy_usage import with_usage
from kvmigrate.proxy.exchange import NOISE, SHADOW, Exchange, Role
from kvmigrate.proxy.forward import (
    Call,
    UpstreamFailure,
    break_kind,
    drain,
    failure_kind,
    is_event_stream,
    open_response,
)
from kvmigrate.proxy.metrics import ProxyMetrics
from kvmigrate.proxy.routed import Routed
from kvmigrate.proxy.shadow import RateBudget, ShadowDispatcher, candidate_dispatchers
from kvmigrate.proxy.unserved import UnservedRoutes
from kvmigrate.proxy.upstream import Upstreams
from kvmigrate.slices import run_on_loop
from kvmigrate.tasks import BoundedTasks, Flight, Work
from kvmigrate.wire.anthropic import MESSAGES_ROUTES

JUDGING_MAX = 16
JUDGING_MAX_BYTES = 256 * 1024 * 1024


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
        calls: Calls,
    ) -> None:
        self.chains, self.chained = chains, chained
        self.upstreams, self.addons = upstreams, addons
        self.calls = calls
        self.noise_budget = RateBudget(config.rollout.noise_per_minute / 60.0)
        self.max_body = config.server.max_body_bytes
        self.unserved = unserved
        shadow_timeout = max(b.read_timeout for b in config.backends.values())
        self.shadow, self.shadows = candidate_dispatchers(config, metrics, shadow_timeout)
        # Long answers judged a slice at a time (`_Copy.judged_later`), after their copy's
        # own slot is free: bounded apart from the copies, in number and in bytes held.
        dropped = metrics.shadow_dropped
        self.judging = BoundedTasks(
            JUDGING_MAX,
            dropped.labels("concurrency_limit").inc,
            byte_limit=JUDGING_MAX_BYTES,
            on_over_bytes=dropped.labels("bytes_limit").inc,
        )

    async def close(self) -> None:
        await self.shadow.close()
        for dispatcher in self.shadows.values():
            await dispatcher.close()
        await self.judging.close()

    def send(self, request: web.Request, routed: Routed, exchange: Exchange) -> None:
        """After the client has its answer, so the copies cannot compete with it."""
        chosen = routed.route
        if not exchange.has_shadow_copy or chosen.shadow is None:
            return
        extra = chosen.extra_shadows(routed.served)
        for backend in (chosen.shadow, *extra):
            # With several candidates the chain map keeps each one's own response ids.
            owner = backend if extra else ""
            shadows = self.chained.expect_shadow_id(exchange.chain, owner)
            sent = self._dispatch(request, routed, backend, SHADOW, exchange, shadows, owner)
            if shadows is not None and not sent:
                self.chains.record_shadow_id(shadows, None, owner)
        if chosen.noise and self.noise_budget.take():
            self._dispatch(request, routed, chosen.serve, NOISE, exchange)

    def _dispatch(
        self,
        request: web.Request,
        routed: Routed,
        backend: str,
        role: Role,
        primary: Exchange,
        shadows: str | None = None,
        owner: str = "",
    ) -> bool:
        """A background copy of the request: to the candidate (shadow) or, for the noise
        floor, once more to the primary. Never waited for, bounded, always accounted.
        `primary`: the exchange of the answer the copy shadows, finished. `shadows`: that
        answer's response id (for `owner`, the candidate whose chain it continues; "": the
        model's only one)."""
        call = self.calls.model_call(request, routed, backend)
        # Anthropic streams always carry usage.
        if routed.path not in MESSAGES_ROUTES:
            call = with_usage(call, routed.body, routed.path)
        dispatcher = self.shadows.get(backend, self.shadow)
        context = self._context(request, routed, dispatcher) if role == SHADOW else None
        copy = _Copy(self, routed, backend, role, primary, call, shadows, owner, context)
        return dispatcher.dispatch(lambda: copy.start(dispatcher), len(call.body))

    def _context(
        self, request: web.Request, routed: Routed, dispatcher: ShadowDispatcher
    ) -> ChainContext | None:
        """How a chained copy reads its turn's context, should the candidate lack the turn
        before: from the backend that stores the chain, as the client's own call went there.
        The calls are built only if it must (the request's headers are still there)."""
        if routed.chain is None or routed.chain.previous is None:
            return None
        stored_on = routed.route.serve

        def read_call(path: str) -> Call:
            primary = routed.route.is_primary(stored_on)
            call = self.calls.call(request, stored_on, path, b"", primary=primary, method="GET")
            # A GET has no body to describe.
            headers = {k: v for k, v in call.headers.items() if k.lower() != "content-type"}
            return Call(call.method, call.url, call.body, headers)

        return ChainContext(self.upstreams[stored_on], read_call, self.max_body, dispatcher.hold)


class _Copy:
    """One copy: sent at once and collected by its answer's callbacks where it can be (an
    idle connection, one replica, no chain to look up first), else run as a task."""

    def __init__(
        self,
        copies: Copies,
        routed: Routed,
        backend: str,
        role: Role,
        primary: Exchange,
        call: Call,
        shadows: str | None,
        owner: str,
        context: ChainContext | None = None,
    ) -> None:
        self.copies, self.routed, self.backend, self.role = copies, routed, backend, role
        self.call, self.shadows, self.owner = call, shadows, owner
        self.context = context  # where a chained copy reads its turn's context, if it must
        self.primary_id, self.primary_status = primary.request_id, primary.status
        # The copy is recorded in its answer's conversation, as that answer was: the
        # recorder pairs them within one lane, chosen by this key.
        self.in_store = primary.conversation_in_store
        self.upstream = copies.upstreams[backend]

    def start(self, dispatcher: ShadowDispatcher) -> Work | Flight | None:
        if self.role == SHADOW and self.routed.chain is not None:
            return self.run()  # its body waits for the chain's candidate id
        exchange = self.exchange()
        call = self.call
        sent = self.upstream.send_now(call.method, call.url, call.headers, call.body)
        if sent is None:
            return self.run(exchange)
        return CopyFlight(
            sent.response,
            exchange.chunks,  # bounded: a candidate's 1 GB answer is not kept whole
            lambda r: self.collected(r, exchange, dispatcher),
            dispatcher.failed,
        )

    def exchange(self) -> Exchange:
        exchange = self.copies.calls.exchange(
            self.routed, self.backend, self.role, time.perf_counter()
        )
        exchange.pair_id = self.primary_id
        exchange.conversation_in_store = self.in_store
        if isinstance(exchange.chain, ChainTurn):
            exchange.chain.copy_of, exchange.chain.copy_owner = self.shadows, self.owner
        exchange.request_body = self.call.body
        return exchange

    async def run(self, exchange: Exchange | None = None) -> None:
        """The copy as a task: sent on a connection it may wait for, its answer read."""
        try:
            call = self.call
            if exchange is None and self.routed.chain is not None:  # see `start`
                chain, owner = self.routed.chain, self.owner
                body = await self.copies.chained.copy_body(call.body, chain, owner, self.context)
                if body is None:
                    return
                self.call = Call(call.method, call.url, body, call.headers)
            exchange = exchange or self.exchange()
            try:
                response = await open_response(self.upstream, self.call)
            except UpstreamFailure as failure:
                exchange.error = failure.kind
            else:
                exchange.status = response.status
                event_stream = is_event_stream(response)
                await drain(response, exchange)
                await self.judge_on_loop(exchange, event_stream)
            self.done(exchange)
        finally:
            self.settle()

    def collected(
        self, response: Response | None, exchange: Exchange, dispatcher: ShadowDispatcher
    ) -> None:
        """A flight's end (None: cancelled, and not reported, as a task's copy). A reused
        connection the server closed before answering gets the copy once more, as a task
        on a new one (as `HttpClient.answer` does); that task settles the chain."""
        error = response.error if response is not None else None
        retried = isinstance(error, ServerDisconnected) and error.before_answer
        if retried and dispatcher.dispatch(lambda: self.run(exchange), len(self.call.body)):
            return
        if response is not None and error is None and self.judged_later(response, exchange):
            return
        try:
            if response is not None:
                self.record(response, exchange, error)
        finally:
            self.settle()

    def record(self, response: Response, exchange: Exchange, error: UpstreamError | None) -> None:
        if error is not None and not response.status:
            exchange.error = failure_kind(error)
        else:
            exchange.status = response.status
            exchange.first_byte = response.first_body_at or None
            if error is not None:
                exchange.error = break_kind(error)
            else:
                self.judge(exchange, is_event_stream(response))
        self.done(exchange)

    def judges(self, exchange: Exchange) -> bool:
        return exchange.error is None and self.routed.route.is_candidate(self.backend)

    def judge(self, exchange: Exchange, event_stream: bool) -> None:
        if self.judges(exchange):
            exchange.error = self.copies.unserved.copy_error(
                exchange, event_stream, self.primary_status
            )

    async def judge_on_loop(self, exchange: Exchange, event_stream: bool) -> None:
        """`judge`, a long answer read a slice at a time, the loop free between slices."""
        if self.judges(exchange):
            verdict = self.copies.unserved.copy_error_sliced(
                exchange, event_stream, self.primary_status
            )
            exchange.error = await run_on_loop(verdict)

    def judged_later(self, response: Response, exchange: Exchange) -> bool:
        """Whether a task judges and records the copy: a candidate's long event stream is
        read a slice at a time (judged at once, it held the loop for as long as that took).
        Past the bound of such tasks the copy is dropped and counted, as one past the
        dispatcher's is."""
        if not (
            response.status == 200
            and is_event_stream(response)
            and exchange.long_answer
            and self.judges(exchange)
        ):
            return False
        # Its times are the answer's, not the judging's.
        exchange.status = response.status
        exchange.first_byte = response.first_body_at or None
        exchange.finished = time.perf_counter()
        if not self.copies.judging.start(
            lambda: self.judge_and_record(exchange), exchange.answer_bytes
        ):
            self.settle()
        return True

    async def judge_and_record(self, exchange: Exchange) -> None:
        try:
            await self.judge_on_loop(exchange, event_stream=True)
            self.done(exchange)
        finally:
            self.settle()

    def done(self, exchange: Exchange) -> None:
        exchange.finished = exchange.finished or time.perf_counter()
        self.copies.addons.exchange_done(exchange)

    def settle(self) -> None:
        if self.shadows is not None:  # a no-op once its id is known
            self.copies.chains.record_shadow_id(self.shadows, None, self.owner)
