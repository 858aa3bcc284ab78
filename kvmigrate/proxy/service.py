"""The proxy's request handling: authorise, read, decide, forward, relay, shadow."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp import web

from kvmigrate.config import Config
from kvmigrate.policies import Decision, RolloutSnapshot, conversation_key, decide, turn_index
from kvmigrate.proxy.addons import Addons
from kvmigrate.proxy.body import RequestBody, check_passthrough_body, parse_body, with_model
from kvmigrate.proxy.errors import ProxyError, body_too_large, model_not_found, unauthorized
from kvmigrate.proxy.exchange import SERVE, SHADOW, Exchange
from kvmigrate.proxy.forward import (
    Call,
    UpstreamFailure,
    drain,
    open_response,
    read_first_chunk,
    read_whole,
    relay_stream,
    send_buffered,
    should_stream,
)
from kvmigrate.proxy.headers import bearer_token, upstream_headers
from kvmigrate.proxy.metrics import ProxyMetrics
from kvmigrate.proxy.metrics_addon import MetricsAddon
from kvmigrate.proxy.shadow import ShadowDispatcher
from kvmigrate.proxy.upstream import Upstreams, safe_suffix


class RolloutSource(Protocol):
    def current(self) -> RolloutSnapshot: ...

    async def resolve(self, conversation: str, turn: int, decision: Decision) -> Decision:
        """The final decision for a conversation (pins applied)."""
        ...


class StaticRollout:
    """The rollout as the config file sets it."""

    def __init__(self, config: Config) -> None:
        r = config.rollout
        self._snapshot = RolloutSnapshot(
            primary=r.primary,
            candidate=r.candidate,
            mode=r.mode,
            percent=r.percent,
            shadow_sample=r.shadow_sample,
            salt=r.salt,
            fallback=r.fallback,
        )

    def current(self) -> RolloutSnapshot:
        return self._snapshot

    async def resolve(self, conversation: str, turn: int, decision: Decision) -> Decision:
        return decision


@dataclass(frozen=True, slots=True)
class Routed:
    """A validated request on a model route, with its routing facts."""

    route: str  # the path below /v1, e.g. "chat/completions"
    body: RequestBody
    conversation: str
    turn: int
    decision: Decision
    served: dict[str, str]


class ProxyService:
    def __init__(
        self, config: Config, rollout: RolloutSource | None = None, addons: Sequence[object] = ()
    ) -> None:
        self.config = config
        self.rollout = rollout or StaticRollout(config)
        self.metrics = ProxyMetrics()
        self.addons = Addons([MetricsAddon(self.metrics), *addons])
        self.addons.trigger("register_metrics", self.metrics.registry)
        self.upstreams = Upstreams(config)
        shadow_timeout = max(b.read_timeout for b in config.backends.values())
        self.shadow = ShadowDispatcher(
            config.rollout.shadow_max_concurrency, self.metrics, shadow_timeout
        )

    async def start(self) -> None:
        await self.addons.trigger_async("running")

    async def close(self) -> None:
        await self.shadow.close()
        await self.upstreams.close()
        await self.addons.trigger_async("done")

    # -- the model routes -------------------------------------------------------------------

    async def handle_model_route(self, request: web.Request, route: str) -> web.StreamResponse:
        started = time.perf_counter()
        self.authorize(request)
        routed = await self._route(request, route, await self.read_body(request))
        serve = routed.decision.serve
        exchange = self._exchange(routed, serve, SERVE, started)
        try:
            return await self._answer(request, routed, exchange, started)
        finally:
            # After the client has its answer, so the copy cannot compete with it.
            if routed.decision.shadow is not None:
                self._dispatch_shadow(request, routed, routed.decision.shadow, exchange.request_id)

    async def _route(self, request: web.Request, route: str, raw: bytes) -> Routed:
        body = parse_body(raw)
        model_route = self.config.route(body.model)
        if model_route is None:
            raise model_not_found(body.model)
        snapshot = self.rollout.current()
        conversation = conversation_key(request.headers, body.data, body.model).value
        served = model_route.served
        if snapshot.primary not in served:
            decision = Decision(serve=snapshot.candidate)
        else:
            decision = decide(conversation, snapshot, snapshot.candidate in served)
        turn = turn_index(body.data)
        decision = await self.rollout.resolve(conversation, turn, decision)
        return Routed(route, body, conversation, turn, decision, served)

    async def _answer(
        self, request: web.Request, routed: Routed, exchange: Exchange, started: float
    ) -> web.StreamResponse:
        call_at = time.perf_counter()
        try:
            response, first = await self._open(request, routed, exchange)
        except UpstreamFailure as failure:
            exchange.error = failure.kind
            exchange.finished = time.perf_counter()
            self.addons.exchange_done(exchange)
            fallback = routed.decision.fallback
            if fallback is None:
                raise failure.error from None
            self.metrics.fallbacks.labels(failure.kind).inc()
            exchange = self._exchange(
                routed, fallback, SERVE, time.perf_counter(), fallback_from=exchange.backend
            )
            try:
                response, first = await self._open(request, routed, exchange)
            except UpstreamFailure as second:
                exchange.error = second.kind
                exchange.finished = time.perf_counter()
                self.addons.exchange_done(exchange)
                raise
        overhead = (call_at - started) + (time.perf_counter() - (exchange.first_byte or call_at))
        self.metrics.overhead.observe(overhead)
        extra = [
            ("x-request-id", exchange.request_id),
            ("x-kvmigrate-backend", exchange.backend),
            ("x-kvmigrate-overhead-ms", f"{overhead * 1000:.3f}"),
        ]
        client: web.StreamResponse
        if first is None:
            client = await send_buffered(request, response, exchange.chunks[0], extra)
        else:
            client = await relay_stream(request, response, first, exchange, extra)
        self.addons.exchange_done(exchange)
        return client

    async def _open(
        self, request: web.Request, routed: Routed, exchange: Exchange
    ) -> tuple[aiohttp.ClientResponse, bytes | None]:
        """Open the upstream response up to its first bytes. Returns the first chunk of a
        stream, or None when the whole (small) body is already in `exchange.chunks`."""
        upstream = self.upstreams[exchange.backend]
        call = self._call(request, routed, exchange.backend)
        exchange.request_body = call.body
        response = await open_response(upstream, call)
        exchange.status = response.status
        if (
            response.status >= 500
            and routed.decision.fallback
            and exchange.role == SERVE
            and exchange.fallback_from is None
        ):
            response.close()
            raise UpstreamFailure(
                f"http_{response.status}",
                ProxyError(
                    502,
                    f"Backend `{exchange.backend}` answered {response.status}.",
                    "server_error",
                    "upstream_error",
                ),
            )
        if should_stream(response):
            return response, await read_first_chunk(upstream, response, exchange)
        await read_whole(upstream, response, exchange)
        return response, None

    def _call(self, request: web.Request, routed: Routed, backend: str) -> Call:
        upstream = self.upstreams[backend]
        is_primary = backend == self.rollout.current().primary
        headers = upstream_headers(
            request.headers,
            upstream.config.api_key,
            pass_client_credentials=is_primary and self.config.server.master_key is None,
        )
        url = upstream.url(routed.route, routed.conversation)
        if request.query_string:
            url += "?" + request.query_string
        return Call("POST", url, with_model(routed.body, routed.served[backend]), headers)

    def _exchange(
        self,
        routed: Routed,
        backend: str,
        role: str,
        started: float,
        fallback_from: str | None = None,
    ) -> Exchange:
        return Exchange(
            request_id="req_" + os.urandom(12).hex(),
            route=routed.route,
            backend=backend,
            role=role,
            model=routed.body.model,
            served_model=routed.served[backend],
            conversation=routed.conversation,
            turn=routed.turn,
            stream=routed.body.stream,
            started=started,
            fallback_from=fallback_from,
        )

    def _dispatch_shadow(
        self, request: web.Request, routed: Routed, backend: str, primary_id: str
    ) -> None:
        call = self._call(request, routed, backend)

        async def copy() -> None:
            exchange = self._exchange(routed, backend, SHADOW, time.perf_counter())
            exchange.pair_id = primary_id
            exchange.request_body = call.body
            upstream = self.upstreams[backend]
            try:
                response = await open_response(upstream, call)
            except UpstreamFailure as failure:
                exchange.error = failure.kind
            else:
                exchange.status = response.status
                await drain(response, exchange)
            exchange.finished = exchange.finished or time.perf_counter()
            self.addons.exchange_done(exchange)

        self.shadow.dispatch(copy)

    # -- everything else --------------------------------------------------------------------

    def authorize(self, request: web.Request) -> None:
        master = self.config.server.master_key
        if master is None:
            return
        token = bearer_token(request.headers)
        if token is None:
            raise unauthorized("Missing API key: send it as `Authorization: Bearer <key>`.")
        if not master.matches(token):
            raise unauthorized("Incorrect API key provided.")

    async def read_body(self, request: web.Request) -> bytes:
        limit = self.config.server.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise body_too_large(limit)
        try:
            # A client that trickles its body (slow-loris) must not hold a slot forever.
            return await asyncio.wait_for(request.read(), self.config.server.body_timeout_seconds)
        except web.HTTPRequestEntityTooLarge:
            raise body_too_large(limit) from None
        except TimeoutError:
            raise ProxyError(
                408,
                "The request body did not arrive in time.",
                "invalid_request_error",
                "request_timeout",
            ) from None

    async def handle_passthrough(self, request: web.Request) -> web.StreamResponse:
        """Any other /v1 path goes to the primary unchanged."""
        started = time.perf_counter()
        self.authorize(request)
        suffix = safe_suffix(request.match_info["suffix"])
        raw = await self.read_body(request)
        check_passthrough_body(request.content_type, raw)
        primary = self.rollout.current().primary
        upstream = self.upstreams[primary]
        headers = upstream_headers(
            request.headers,
            upstream.config.api_key,
            pass_client_credentials=self.config.server.master_key is None,
        )
        url = upstream.url(suffix)
        if request.query_string:
            url += "?" + request.query_string
        exchange = Exchange(
            request_id="req_" + os.urandom(12).hex(),
            route="other",
            backend=primary,
            role=SERVE,
            model="",
            served_model="",
            conversation="",
            turn=0,
            stream=False,
            started=started,
        )
        response = await open_response(upstream, Call(request.method, url, raw, headers))
        exchange.status = response.status
        extra = [("x-request-id", exchange.request_id), ("x-kvmigrate-backend", primary)]
        client: web.StreamResponse
        if should_stream(response):
            first = await read_first_chunk(upstream, response, exchange)
            client = await relay_stream(request, response, first, exchange, extra)
        else:
            body = await read_whole(upstream, response, exchange)
            client = await send_buffered(request, response, body, extra)
        self.addons.exchange_done(exchange)
        return client
