"""`/admin/rollout`: the rollout controller over HTTP, guarded by `server.admin_key`.

    GET  /admin/rollout              status: state, steps, next step, gate verdicts (for
                                     each candidate, and the candidates compared)
                                     (?cohort=NAME; required when the config has several)
    GET  /admin/rollout/cohorts      every cohort's status
    GET  /admin/rollout/history      the audit trail (?limit=N, ?cohort=NAME)
    POST /admin/rollout              {"percent": 50, "reason": "...", "force": false}
                                     and/or {"mode": "split"}, one change; "cohort": NAME
                                     selects one
    POST /admin/rollback             {"reason": "...", "cohort": NAME}

The bodies are the types of `kvmigrate.rollout.api`: one that does not fit gets a 400 naming
the field.

Store calls are blocking, so they run on a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from aiohttp import web

from kvmigrate.config import Secret, ServerConfig
from kvmigrate.logtext import printable
from kvmigrate.proxy.errors import ProxyError, bad_request
from kvmigrate.proxy.headers import bearer_token
from kvmigrate.proxy.intake import read_body
from kvmigrate.rollout.api import (
    BodyError,
    CohortStatuses,
    RollbackRequest,
    RolloutChange,
    RolloutHistory,
    decode_request,
)
from kvmigrate.rollout.controller import (
    GatesRefused,
    NoteTooLong,
    RolloutController,
    RolloutError,
)
from kvmigrate.rollout.store import StoreError, UnreadableState

T = TypeVar("T")
# Every refusal's message is cut to this, whatever it quotes: the values a client sent are
# bounded where they are quoted, and this bounds what no one thought to.
MESSAGE_LIMIT = 2048
Handler = Callable[[web.Request], Awaitable[web.Response]]


def add_admin_routes(
    app: web.Application, controller: RolloutController, server: ServerConfig
) -> None:
    """The routes, guarded by `server.admin_key`; their bodies are read within the
    server's size and time limits, as the model routes' are."""
    admin_key = server.admin_key

    def guarded(
        handler: Callable[[web.Request, RolloutController], Awaitable[web.Response]],
    ) -> Handler:
        @functools.wraps(handler)
        async def wrapper(request: web.Request) -> web.Response:
            _authorize(request, admin_key)
            try:
                return await handler(request, controller)
            except GatesRefused as exc:
                return _json(
                    {
                        "error": {
                            "message": _message(exc),
                            "type": "gates_refused",
                            "param": None,
                            "code": "gates_refused",
                        },
                        "gates": exc.results,
                    },
                    409,
                )
            except NoteTooLong as exc:  # the decoder refuses these first
                raise bad_request(_message(exc), param=exc.field) from None
            except RolloutError as exc:
                raise ProxyError(
                    409, _message(exc), "invalid_request_error", "rollout_refused"
                ) from None
            except (StoreError, UnreadableState) as exc:  # down, or written by a newer version
                raise ProxyError(
                    503,
                    f"rollout store unavailable: {_message(exc)}",
                    "server_error",
                    "store_unavailable",
                ) from None

        return wrapper

    app.router.add_get("/admin/rollout", guarded(_status))
    app.router.add_get("/admin/rollout/cohorts", guarded(_cohorts))
    app.router.add_get("/admin/rollout/history", guarded(_history))
    app.router.add_post("/admin/rollout", guarded(functools.partial(_change, server=server)))
    app.router.add_post("/admin/rollback", guarded(functools.partial(_rollback, server=server)))


def _authorize(request: web.Request, admin_key: Secret | None) -> None:
    if admin_key is None:
        raise ProxyError(
            403,
            "The admin API is disabled: set server.admin_key to enable it.",
            "invalid_request_error",
            "admin_disabled",
        )
    token = bearer_token(request.headers)
    if token is None or not admin_key.matches(token):
        raise ProxyError(
            401, "A valid admin key is required.", "invalid_request_error", "invalid_admin_key"
        )


async def _status(request: web.Request, controller: RolloutController) -> web.Response:
    return _json(await asyncio.to_thread(controller.status, request.query.get("cohort")))


async def _cohorts(request: web.Request, controller: RolloutController) -> web.Response:
    return _json(CohortStatuses(await asyncio.to_thread(controller.statuses)))


async def _history(request: web.Request, controller: RolloutController) -> web.Response:
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        raise bad_request("limit must be a whole number", param="limit") from None
    events = await asyncio.to_thread(
        controller.history, max(1, min(limit, 10_000)), request.query.get("cohort")
    )
    return _json(RolloutHistory(events))


async def _change(
    request: web.Request, controller: RolloutController, *, server: ServerConfig
) -> web.Response:
    change = await _body(request, server, RolloutChange)
    if change.percent is None and change.mode is None:
        raise bad_request('send {"percent": N} and/or {"mode": "shadow"|"split"}')
    # One change however many fields it names: a mode and a percent written apart would
    # leave half a change behind when the second is refused.
    outcome = await asyncio.to_thread(
        controller.change,
        change.percent,
        change.mode,
        change.reason,
        change.actor or "admin-api",
        change.force,
        change.cohort,
        change.candidate,
        change.expected_version,
    )
    return _json(outcome)


async def _rollback(
    request: web.Request, controller: RolloutController, *, server: ServerConfig
) -> web.Response:
    body = await _body(request, server, RollbackRequest)
    outcome = await asyncio.to_thread(
        controller.rollback, body.reason, body.actor or "admin-api", cohort=body.cohort
    )
    return _json(outcome)


async def _body(request: web.Request, server: ServerConfig, cls: type[T]) -> T:
    raw = await read_body(request, server)
    try:
        return decode_request(raw, cls)
    except BodyError as exc:
        raise bad_request(_message(exc), param=exc.param) from None


def _message(exc: Exception) -> str:
    return printable(str(exc), MESSAGE_LIMIT)


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(data), status=status, content_type="application/json"
    )
