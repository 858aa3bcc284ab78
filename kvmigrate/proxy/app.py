"""The proxy's aiohttp application: routes, and the one boundary where errors become envelopes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import aiohttp
import orjson
from aiohttp import web

from kvmigrate.config import Config
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.logtext import printable
from kvmigrate.proxy.client import UpstreamError
from kvmigrate.proxy.envelopes import envelope_for_path
from kvmigrate.proxy.errors import JSON_CONTENT_TYPE, ProxyError, body_too_large, unauthorized
from kvmigrate.proxy.feedback_route import PATH as FEEDBACK_PATH
from kvmigrate.proxy.feedback_route import find_sink, handle_feedback
from kvmigrate.proxy.forward import UpstreamFailure
from kvmigrate.proxy.headers import bearer_token
from kvmigrate.proxy.intake import authorize, expect_handler
from kvmigrate.proxy.paths import MODEL_ROUTES
from kvmigrate.proxy.rollout_source import RolloutSource
from kvmigrate.proxy.service import ProxyService
from kvmigrate.serving import (
    CONNECTION_LIMITS,
    DIRECT_POSTS,
    DRAIN_KEY,
    HURRY_KEY,
    ConnectionLimits,
    default_max_connections,
)
from kvmigrate.wire.anthropic import anthropic_model, anthropic_model_list

log = logging.getLogger("kvmigrate.proxy")

SERVICE_KEY = web.AppKey("kvmigrate_proxy", ProxyService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_boundary(request: web.Request, handler: Handler) -> web.StreamResponse:
    return await guarded(request.app[SERVICE_KEY], request, handler)


async def guarded(
    service: ProxyService, request: web.Request, handler: Handler
) -> web.StreamResponse:
    """Every failure leaves as an error envelope, in the shape the route's clients know
    (proxy.envelopes); nothing raised here crashes a worker. The one boundary: the
    middleware for routed requests, and the model routes' direct handlers (DIRECT_POSTS)."""
    try:
        return await handler(request)
    except ProxyError as exc:
        error = exc
    except UpstreamFailure as failure:
        error = failure.error
    except web.HTTPRequestEntityTooLarge:
        error = body_too_large(service.config.server.max_body_bytes)
    except web.HTTPException as exc:
        error = ProxyError(exc.status, exc.reason, "invalid_request_error", None)
    except (asyncio.CancelledError, ConnectionResetError, aiohttp.ClientConnectionResetError):
        raise
    except Exception:
        log.exception(
            "unhandled error on %s %s", printable(request.method), printable(request.path)
        )
        error = ProxyError(500, "The proxy failed to handle this request.", "server_error")
    service.metrics.client_errors.labels(str(error.status)).inc()
    return error.response(body=envelope_for_path(request.path).body(error))


def build_proxy_app(
    config: Config,
    rollout: RolloutSource | None = None,
    addons: Sequence[object] = (),
    identity: ContinuityResolver | None = None,
) -> web.Application:
    service = ProxyService(config, rollout, addons, identity)
    # A compressed body stays compressed until a route has checked the key (proxy.inflate):
    # aiohttp's parser would inflate it as it arrives, on the loop and past any limit.
    app = web.Application(
        middlewares=[error_boundary],
        client_max_size=config.server.max_body_bytes,
        handler_args={"auto_decompress": False},
    )
    app[SERVICE_KEY] = service
    app[CONNECTION_LIMITS] = _connection_limits(config, service)
    expect = expect_handler(
        config.server, lambda status: service.metrics.client_errors.labels(str(status)).inc()
    )
    for route in MODEL_ROUTES:
        handler = partial(service.handle_model_route, path=route)
        app.router.add_post(f"/v1/{route}", handler, expect_handler=expect)
    # Every agent turn: found by its exact path, past the router and the middleware chain
    # (an aiohttp match object, a context manager and two coroutine frames per request).
    direct: dict[str, Handler] = {
        f"/v1/{route}": partial(
            guarded, service, handler=partial(service.handle_model_route, path=route)
        )
        for route in MODEL_ROUTES
    }
    app[DIRECT_POSTS] = direct
    app.router.add_get("/v1/models", partial(list_models, config))
    # Named `suffix`: a name that is no alias is the primary's to answer (pass-through).
    app.router.add_get("/v1/{suffix:models/.+}", partial(get_model, config))
    app.router.add_get("/health", health)
    app.router.add_get("/ready", partial(ready, service, Readiness()))
    app.router.add_get("/metrics", partial(metrics, service))
    feedback = find_sink(addons)
    app.router.add_post(FEEDBACK_PATH, partial(handle_feedback, service, feedback))
    if feedback is not None:
        app.on_cleanup.append(lambda _app: asyncio.to_thread(feedback.close))
    app.router.add_route("*", "/v1/{suffix:.*}", service.handle_passthrough, expect_handler=expect)
    app.on_startup.append(lambda _app: service.start())
    # Before aiohttp waits for the handlers, cancels them and closes their connections.
    app.on_shutdown.append(lambda app: service.stopping(app.get(DRAIN_KEY)))
    app[HURRY_KEY] = service.end_now
    app.on_cleanup.append(lambda _app: service.close())
    return app


def _connection_limits(config: Config, service: ProxyService) -> ConnectionLimits:
    server = config.server
    limits = ConnectionLimits(
        header_timeout=server.header_timeout_seconds,
        idle_timeout=server.idle_timeout_seconds,
        max_connections=server.max_connections or default_max_connections(),
        on_close=lambda reason: service.metrics.connections_closed.labels(reason).inc(),
    )
    service.metrics.gauge_function(
        "kvmigrate_open_connections", "Client connections now open.", lambda: limits.open
    )
    return limits


async def list_models(config: Config, request: web.Request) -> web.Response:
    authorize(request, config.server.master_key)
    if "anthropic-version" in request.headers:  # the anthropic SDKs' models.list()
        return _json(anthropic_model_list([route.model_name for route in config.models]))
    created = int(time.time())
    data = [_model_card(route.model_name, created) for route in config.models]
    return _json({"object": "list", "data": data})


async def get_model(config: Config, request: web.Request) -> web.StreamResponse:
    """`GET /v1/models/{name}`: a `model_name` alias is answered here, as the listing
    answers it (upstream it would be unknown); any other name goes to the primary."""
    service = request.app[SERVICE_KEY]
    name = request.match_info["suffix"].removeprefix("models/")
    if config.route(name) is None:
        return await service.handle_passthrough(request)
    authorize(request, config.server.master_key)
    if "anthropic-version" in request.headers:  # the anthropic SDKs' models.retrieve()
        return _json(anthropic_model(name))
    return _json(_model_card(name, int(time.time())))


def _model_card(name: str, created: int) -> dict[str, object]:
    return {"id": name, "object": "model", "created": created, "owned_by": "kvmigrate"}


async def health(_request: web.Request) -> web.Response:
    return _json({"status": "ok"})


READY_CACHE_SECONDS = 5.0


class Readiness:
    """The last readiness verdict, reused for `READY_CACHE_SECONDS`: every probe would
    otherwise call the hosted API with the org's key (a kubelet probes every few seconds,
    per replica, and anyone who can reach /ready could make it call more)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._at = -READY_CACHE_SECONDS
        self._verdict: tuple[dict[str, object], int] = ({}, 503)

    async def verdict(self, service: ProxyService) -> tuple[dict[str, object], int]:
        async with self._lock:  # concurrent probes wait for one check, not start their own
            if time.monotonic() - self._at >= READY_CACHE_SECONDS:
                self._verdict = await _check(service)
                self._at = time.monotonic()
            return self._verdict


async def ready(service: ProxyService, readiness: Readiness, _request: web.Request) -> web.Response:
    """Ready when the primary answers; the candidate's state is reported alongside."""
    body, status = await readiness.verdict(service)
    return _json(body, status=status)


async def _check(service: ProxyService) -> tuple[dict[str, object], int]:
    snapshot = service.rollout.current()
    names = (snapshot.primary, snapshot.candidate)
    results = await asyncio.gather(*(_probe(service, name) for name in names))
    backends = dict(zip(names, results, strict=True))
    ok = backends[snapshot.primary] == "ok"
    return {"status": "ready" if ok else "not ready", "backends": backends}, 200 if ok else 503


async def _probe(service: ProxyService, name: str) -> str:
    upstream = service.upstreams[name]
    url, headers = upstream.probe()
    try:
        async with asyncio.timeout(3):
            response = await upstream.client.request("GET", url, headers)
            try:
                await response.read()
            finally:
                response.close()
        # A 401 still proves the backend is up: the primary may expect client keys.
        return "ok" if response.status < 500 else f"http {response.status}"
    except (TimeoutError, UpstreamError, OSError) as exc:
        return f"unreachable ({type(exc).__name__})"


async def metrics(service: ProxyService, request: web.Request) -> web.Response:
    key = service.config.server.metrics_key
    if key is not None:
        token = bearer_token(request.headers)
        if token is None or not key.matches(token):
            raise unauthorized("/metrics needs `Authorization: Bearer <server.metrics_key>`.")
    return web.Response(
        body=service.metrics.render(),
        content_type="text/plain",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type=JSON_CONTENT_TYPE)
