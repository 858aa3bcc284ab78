"""The proxy's request handling: authorise, read, decide, forward, relay, shadow."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from kvmigrate.config import Config
from kvmigrate.continuity.chains import ChainMap
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.policies import serve_without_conversation
from kvmigrate.policies.chain import ChainRef, chain_ref
from kvmigrate.policies.conversation import declared_key
from kvmigrate.policies.outcome import ErrorKind, refused_client, worth_a_shadow_copy
from kvmigrate.proxy.addons import Addons
from kvmigrate.proxy.answer_model import Rewrite, answer_model_rewrite
from kvmigrate.proxy.body import RequestBody, check_passthrough_body, parse_body, with_model
from kvmigrate.proxy.calls import Calls, new_request_id
from kvmigrate.proxy.chained import RESPONSES, ChainRouting
from kvmigrate.proxy.client import Response
from kvmigrate.proxy.client_keys import KeyGate
from kvmigrate.proxy.cohorts import CohortResolver
from kvmigrate.proxy.copies import Copies
from kvmigrate.proxy.envelopes import envelope_for
from kvmigrate.proxy.errors import (
    chain_stranded,
    model_not_found,
    route_not_served,
)
from kvmigrate.proxy.exchange import SERVE, Exchange
from kvmigrate.proxy.forward import (
    EarlyCall,
    UpstreamFailure,
    answer_of,
    candidate_failure,
    is_event_stream,
    keep_refusal,
    open_response,
    read_first_chunk,
    read_whole,
    relay_stream,
    send_buffered,
    should_stream,
)
from kvmigrate.proxy.intake import authorize, read_body
from kvmigrate.proxy.kinds import kind_of
from kvmigrate.proxy.metrics import ProxyMetrics
from kvmigrate.proxy.metrics_addon import MetricsAddon
from kvmigrate.proxy.paths import passthrough_suffix
from kvmigrate.proxy.rollout_source import RolloutSource, StaticRollout
from kvmigrate.proxy.routed import Routed
from kvmigrate.proxy.stream_check import SseCheck, framing_error, json_ok
from kvmigrate.proxy.unserved import REFUSALS, UnservedRoutes, blame, is_refusal_status
from kvmigrate.proxy.upstream import Upstreams
from kvmigrate.serving import outlive_client

if TYPE_CHECKING:
    from kvmigrate.litellm_bridge.gateway import LiteLLMGateway

# How long before the drain's end the proxy ends its own streams (ProxyService.stopping).
CUT_BEFORE_DRAIN_END_S = 0.2


class ProxyService:
    def __init__(
        self,
        config: Config,
        rollout: RolloutSource | None = None,
        addons: Sequence[object] = (),
        identity: ContinuityResolver | None = None,
    ) -> None:
        self.config = config
        self.rollout = rollout or StaticRollout(config)
        self.cohorts = CohortResolver(config)
        self.metrics = ProxyMetrics()
        self.keys = KeyGate(config, self.metrics)
        # Without a store, continuity holds within this process only.
        self.identity = identity or ContinuityResolver(ttl_seconds=config.rollout.pin_ttl_seconds)
        self.chains = ChainMap(self.identity)  # Responses API chains, in the same store
        self.addons = Addons([MetricsAddon(self.metrics), self.identity, self.chains, *addons])
        self.chained = ChainRouting(self.chains, self.metrics)
        self.addons.trigger("register_metrics", self.metrics.registry)
        self.metrics.fold_also(self.identity.fold_counts)
        self.gateways: dict[str, LiteLLMGateway] = {}
        upstreams = config
        if any(kind_of(b).via_gateway for b in config.backends.values()):
            # Each is reached through a loopback gateway (kvmigrate.litellm_bridge.gateway).
            from kvmigrate.litellm_bridge.gateway import open_gateways, through_gateways

            self.gateways = open_gateways(config)
            upstreams = through_gateways(config, self.gateways)
        self.upstreams = Upstreams(upstreams)
        # As configured: a litellm backend's gateway speaks OpenAI's wire, whatever it wraps.
        self.kinds = {name: kind_of(b) for name, b in config.backends.items()}
        self.unserved = UnservedRoutes()
        # The handlers relaying an answer, which may outlive their clients (see _answer):
        # aiohttp's shutdown no longer waits for those, `close` ends them.
        self._relays: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self.calls = Calls(config, self.upstreams, self.chained)
        self.copies = Copies(
            config,
            self.metrics,
            self.chains,
            self.chained,
            self.upstreams,
            self.addons,
            self.unserved,
            self.calls,
        )

    async def start(self) -> None:
        for gateway in self.gateways.values():
            await gateway.start()
        await self.addons.trigger_async("running")

    async def stopping(self, drain_s: float | None) -> None:
        """The proxy stops: a request its drain cuts is the proxy's doing, not a client's.
        Streams still running a moment before the drain ends are ended then, with an error
        event (relay_stream), while their connections are open: aiohttp's own end of the
        drain closes them without a word."""
        self._stopping = True
        if drain_s is not None:
            at = max(drain_s - CUT_BEFORE_DRAIN_END_S, 0.0)
            asyncio.get_running_loop().call_later(at, self._cut_relays)

    def end_now(self) -> None:
        """Asked again to stop (serving.HURRY_KEY): streams end now, as at the drain's end."""
        self._stopping = True
        self._cut_relays()

    def _cut_relays(self) -> None:
        for relay in list(self._relays):
            relay.cancel()

    async def close(self) -> None:
        self._cut_relays()
        await asyncio.gather(*self._relays, return_exceptions=True)
        await self.copies.close()
        await self.upstreams.close()
        for gateway in self.gateways.values():
            await gateway.close()
        await self.addons.trigger_async("done")

    # -- the model routes -------------------------------------------------------------------

    async def handle_model_route(self, request: web.Request, path: str) -> web.StreamResponse:
        started = time.perf_counter()
        authorize(request, self.config.server.master_key)
        body = parse_body(await read_body(request, self.config.server))
        served = self._served(path, body)
        cohort = self.cohorts.resolve(body.model, request.headers, body.data)
        ref = chain_ref(body.data) if path == RESPONSES else None
        key = self.keys.key_of(request)
        early = self._send_early(request, path, body, served, cohort, key) if ref is None else None
        try:
            routed = await self._route(request, path, body, served, cohort, ref, key)
            primary = routed.route.snapshot.primary
            asked_at = time.perf_counter()
            refused = None
            if not routed.route.is_primary(routed.route.serve):
                refused = await self.keys.check(request, key, self.upstreams[primary])
        except BaseException:
            if early is not None:
                self.upstreams[early.backend].abandon(early.sent)
            raise
        if refused is not None:
            overhead = asked_at - started
            served_model = routed.served.get(primary, body.model)
            return await refused.answer(request, relayed_headers(primary, overhead, served_model))
        if early is not None and early.backend != routed.route.serve:
            # The rollout changed while the conversation was identified: its new state rules.
            self.upstreams[early.backend].abandon(early.sent)
            early = None
        exchange = self.calls.exchange(routed, routed.route.serve, SERVE, started)
        return await self._answer(request, routed, exchange, started, early)

    def _served(self, path: str, body: RequestBody) -> dict[str, str]:
        """The backends that serve the request's model, each by its own model name."""
        model_route = self.config.route(body.model)
        if model_route is None:
            raise model_not_found(body.model)
        served = model_route.served
        for backend in served:
            if not self.kinds[backend].serves(path):
                raise route_not_served(path, body.model, backend)
        return served

    def _send_early(
        self,
        request: web.Request,
        path: str,
        body: RequestBody,
        served: dict[str, str],
        cohort: str,
        key: bytes | None,
    ) -> EarlyCall | None:
        """Send the call before the conversation is known, where the rollout serves every
        conversation alike (shadow mode): identity, a digest of the whole history and at
        times a store lookup, then runs while the backend works. None where the call must
        wait (split mode, several replicas, no idle connection): the usual path sends it."""
        snapshot = self.rollout.current(cohort)
        backend = serve_without_conversation(snapshot, served)
        if backend is None or (backend != snapshot.primary and not self.keys.accepted(key)):
            return None  # the usual path has the key verified first
        try:
            call = self.calls.call(
                request,
                backend,
                path,
                with_model(body, served[backend]),
                primary=backend == snapshot.primary,
                deployment=served[backend],
            )
            sent = self.upstreams[backend].send_now(call.method, call.url, call.headers, call.body)
        except Exception:  # the usual path meets the same error where it handles it
            return None
        return EarlyCall(backend, call, sent, time.perf_counter()) if sent is not None else None

    async def _route(
        self,
        request: web.Request,
        path: str,
        body: RequestBody,
        served: dict[str, str],
        cohort: str,
        ref: ChainRef | None,
        key: bytes | None,
    ) -> Routed:
        if ref is None:
            identity = await self.identity.identify(request.headers, body.data, body.model, path)
            chosen = await self.rollout.route(identity.conversation, identity.turn, served, cohort)
        else:
            # A continued chain still goes where it is stored; the cohort only picks whose
            # rollout (and pins) the rest of the decision follows.
            declared = declared_key(request.headers, body.data, path)
            identity, chosen = await self.chained.route(
                ref,
                body,
                served,
                lambda c, t, s: self.rollout.route(c, t, s, cohort),
                declared.value if declared else None,
            )
        conversation, turn = identity.conversation, identity.turn
        return Routed(path, body, conversation, turn, chosen, served, identity, ref, cohort, key)

    async def _answer(
        self,
        request: web.Request,
        routed: Routed,
        exchange: Exchange,
        started: float,
        early: EarlyCall | None = None,
    ) -> web.StreamResponse:
        call_at = early.sent_at if early is not None else time.perf_counter()
        try:
            try:
                response, first, check = await self._open(request, routed, exchange, early)
            except UpstreamFailure as failure:
                failed, exchange = exchange, self._fall_back(routed, exchange, failure)
                try:
                    response, first, check = await self._open(request, routed, exchange)
                except UpstreamFailure as second:
                    self._finish(routed, exchange, second.kind)
                    raise
                finally:
                    if failure.kind in REFUSALS:  # whose refusal, the primary's answer says
                        self._finish(routed, failed, blame(failure.kind, exchange.status))
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                # The client left before the first byte (aiohttp cancels the handler, and
                # with it the upstream call). Its wait is evidence: a backend slow enough
                # that clients give up is what the gates and auto-rollback exist to catch.
                stop = ErrorKind.PROXY_SHUTDOWN if self._stopping else ErrorKind.CLIENT_CANCELLED
                self._finish(routed, exchange, stop)
            self.copies.send(request, routed, exchange)
            raise
        # From the first byte on, the relay runs to its end even if the client leaves: it
        # notices at its next write, records what was sent, and the answer's copies go out.
        outlive_client(request)
        relay = asyncio.current_task()
        assert relay is not None
        self._relays.add(relay)
        try:
            return await self._relay(
                request, routed, exchange, response, first, check, call_at - started
            )
        finally:
            self._relays.discard(relay)

    def _fall_back(self, routed: Routed, failed: Exchange, failure: UpstreamFailure) -> Exchange:
        """Record the failed first attempt (a refusal once the fallback has answered); the
        exchange with the fallback backend, or the failure itself when there is none."""
        fallback = routed.route.fallback
        if fallback is None or failure.kind not in REFUSALS:
            self._finish(routed, failed, failure.kind)
        failed.finished = failed.finished or time.perf_counter()
        if fallback is None:
            if routed.chain is not None:
                raise chain_stranded(failure.error, failed.backend) from None
            raise failure.error from None
        self.metrics.fallbacks.labels(failure.kind).inc()
        return self.calls.exchange(
            routed, fallback, SERVE, time.perf_counter(), fallback_from=failed.backend
        )

    def _finish(self, routed: Routed, exchange: Exchange, error: str | None = None) -> None:
        """Hand a finished exchange on (records, metrics, gates), deciding first whether it
        earns the candidate a shadow copy: by default only an answer the primary gave does
        (see worth_a_shadow_copy)."""
        if error is not None:
            exchange.error = error
        exchange.finished = exchange.finished or time.perf_counter()
        served = exchange.backend == routed.route.serve and exchange.role == SERVE
        if served and routed.route.is_primary(exchange.backend):
            self.keys.learn(routed.key, exchange.status)
        worth_a_copy = (
            served
            and routed.route.shadow is not None
            and not refused_client(exchange.status)
            and (
                self.config.rollout.shadow_primary_failures
                or worth_a_shadow_copy(exchange.status, exchange.error)
            )
        )
        exchange.has_shadow_copy = worth_a_copy and self.keys.accepted(routed.key)
        if worth_a_copy and not exchange.has_shadow_copy:
            # Counted, so a report's "answers without a shadow copy" add up.
            self.metrics.count(self.metrics.shadow_dropped, "key_unverified")
        self.addons.exchange_done(exchange)

    async def _relay(
        self,
        request: web.Request,
        routed: Routed,
        exchange: Exchange,
        response: Response,
        first: bytes | None,
        check: SseCheck | None,
        before_call: float,
    ) -> web.StreamResponse:
        """Relay the opened answer to the client, then hand the finished exchange on."""
        now = time.perf_counter()
        overhead = before_call + (now - (exchange.first_byte or now))
        self.metrics.observe(self.metrics.overhead, overhead)
        extra = relayed_headers(
            exchange.backend, overhead, exchange.served_model, exchange.request_id
        )
        rewrite = self._answer_model(exchange)
        client: web.StreamResponse
        try:
            if first is None:
                body = exchange.chunks[0]
                if response.status >= 400 and routed.route.is_candidate(exchange.backend):
                    # The client knows the primary's error shape; the record keeps the
                    # candidate's own bytes (exchange.chunks).
                    envelope = envelope_for(routed.path)
                    body = envelope.backend_error(response.status, body, routed.path) or body
                body = rewrite(body) if rewrite else body
                # The answer's link is in the store before the client has a byte of it.
                await self.identity.settle(exchange)
                client = await send_buffered(request, response, body, extra)
            else:
                client = await relay_stream(
                    request,
                    response,
                    first,
                    exchange,
                    extra,
                    check,
                    rewrite,
                    before_eof=lambda: self.identity.settle(exchange),
                )
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            # The client left while a whole answer was being written: still a record.
            self._finish(routed, exchange, ErrorKind.CLIENT_DISCONNECTED)
            raise
        except asyncio.CancelledError:  # the drain ended first: recorded as cut, no copies
            self._finish(routed, exchange, ErrorKind.PROXY_SHUTDOWN)
            raise
        self._finish(routed, exchange)
        self.copies.send(request, routed, exchange)
        primary = routed.route.snapshot.primary
        if exchange.backend == primary:
            self.keys.ask_after_keyless_success(
                request, routed.key, exchange.status, self.upstreams[primary]
            )
        return client

    def _answer_model(self, exchange: Exchange) -> Rewrite | None:
        """With `server.answer_model: requested`, the answer names the client's model."""
        if self.config.server.answer_model != "requested":
            return None
        return answer_model_rewrite(exchange.served_model, exchange.model)

    async def _open(
        self,
        request: web.Request,
        routed: Routed,
        exchange: Exchange,
        early: EarlyCall | None = None,
    ) -> tuple[Response, bytes | None, SseCheck | None]:
        """Open the upstream response up to its first bytes (of the call sent `early`, if it
        was). Returns the first chunk of a stream (None when the whole small body is already
        in `exchange.chunks`), and the check that the rest of a candidate's stream must pass."""
        upstream = self.upstreams[exchange.backend]
        if early is not None:
            exchange.request_body = early.call.body
            response = await answer_of(upstream, early.sent)
        else:
            call = self.calls.model_call(request, routed, exchange.backend)
            exchange.request_body = call.body
            response = await open_response(upstream, call)
        exchange.status = response.status
        # The candidate is checked; a failure before the first byte can still fall back.
        checked = routed.route.is_candidate(exchange.backend)
        can_fall_back = routed.route.fallback is not None and exchange.fallback_from is None
        if can_fall_back and (response.status >= 500 or response.status == 429):
            response.close()
            raise candidate_failure(exchange.backend, f"http_{response.status}")
        if can_fall_back and checked and is_refusal_status(response.status):
            await keep_refusal(response, exchange)  # its reason says which refusal
            kind = self.unserved.refusal(
                exchange.backend, routed.path, response.status, exchange.body()
            )
            raise candidate_failure(exchange.backend, kind or ErrorKind.REJECTED)
        if checked and (
            framing := framing_error(response.status, routed.body.stream, is_event_stream(response))
        ):
            response.close()
            raise candidate_failure(exchange.backend, framing)
        if should_stream(response):
            first = await read_first_chunk(upstream, response, exchange)
            check = SseCheck() if checked and is_event_stream(response) else None
            if check is not None and not check.feed(first):
                response.close()
                raise candidate_failure(exchange.backend, ErrorKind.MALFORMED_STREAM)
            return response, first, check
        body = await read_whole(upstream, response, exchange)
        if checked and response.status == 200 and not json_ok(body):
            raise candidate_failure(exchange.backend, ErrorKind.MALFORMED_BODY)
        return response, None, None

    # -- everything else --------------------------------------------------------------------

    async def handle_passthrough(self, request: web.Request) -> web.StreamResponse:
        """Any other /v1 path goes to the primary unchanged (a stored response, to the
        backend that stored it)."""
        started = time.perf_counter()
        authorize(request, self.config.server.master_key)
        suffix = passthrough_suffix(request)
        raw = await read_body(request, self.config.server)
        check_passthrough_body(request.content_type, raw)
        primary = self.rollout.current().primary
        backend = await self.chained.stored_on(suffix, self.config.backends) or primary
        if backend != primary:  # a response the candidate stored: the primary vouches first
            key = self.keys.key_of(request)
            refused = await self.keys.check(request, key, self.upstreams[primary])
            if refused is not None:
                extra = [("x-request-id", new_request_id()), ("x-kvmigrate-backend", primary)]
                return await refused.answer(request, extra)
        upstream = self.upstreams[backend]
        call = self.calls.call(request, backend, suffix, raw, primary=backend == primary)
        exchange = self.calls.exchange(None, backend, SERVE, started)
        response = await open_response(upstream, call)
        exchange.status = response.status
        extra = [("x-request-id", exchange.request_id), ("x-kvmigrate-backend", backend)]
        client: web.StreamResponse
        if should_stream(response):
            first = await read_first_chunk(upstream, response, exchange)
            client = await relay_stream(request, response, first, exchange, extra)
        else:
            body = await read_whole(upstream, response, exchange)
            client = await send_buffered(request, response, body, extra)
        self.addons.exchange_done(exchange)
        return client


def relayed_headers(
    backend: str, overhead: float, served_model: str, request_id: str | None = None
) -> list[tuple[str, str]]:
    """The proxy's own headers on a model route's answer relayed from `backend`."""
    return [
        ("x-request-id", request_id or new_request_id()),
        ("x-kvmigrate-backend", backend),
        ("x-kvmigrate-overhead-ms", f"{overhead * 1000:.3f}"),
        ("x-kvmigrate-served-model", served_model),
    ]
