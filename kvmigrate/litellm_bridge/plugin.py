"""kvmigrate inside LiteLLM's proxy: sticky split, shadow copies and records, as a callback.

Load it from LiteLLM's `config.yaml`, with the kvmigrate config in `KVMIGRATE_CONFIG`:

    litellm_settings:
      callbacks: kvmigrate.litellm_bridge.plugin.proxy_handler_instance

The kvmigrate config's `models:` map each client-facing model group to the LiteLLM model
groups of the rollout's primary and candidate (`model_name: gpt-4o-mini, hosted:
gpt-4o-mini, vllm: vllm-llama`); `rollout:` and `record:` apply as in kvmigrate's own proxy.

- `async_pre_call_hook` keys the conversation as the proxy does (X-Session-ID, `user`,
  Messages' `metadata.user_id`, continuity with an earlier answer, else the masked
  opening), picks its cohort, decides with the rollout snapshot that a background task
  keeps current from kvmigrate's rollout store (`kvmigrate rollout --percent 50` steers
  LiteLLM within a second), applies the conversation's pin, and rewrites `data["model"]`
  to the chosen group (with the primary as a request-level fallback when the candidate
  serves). A Responses turn continuing a stored response goes to the group that stored it
  (kvmigrate.litellm_bridge.chains).
- the post-call hooks read a Responses answer's id on its way to the client (a next turn
  may arrive before LiteLLM logs this one);
- the success and failure logging hooks record the answer to kvmigrate's recorder and then
  copy the request to each candidate group the rollout shadows to (and, for a budgeted
  share, once more to the primary for the noise floor); the recorder scores each copy
  against the answer. Chat, Responses and Anthropic Messages (`/v1/messages`) alike.

Every hook catches its own exceptions: the plugin can fail, LiteLLM's request cannot.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from kvmigrate.config import Config, load_config
from kvmigrate.continuity.resolver import ContinuityResolver, Identity
from kvmigrate.litellm_bridge.answer import answer_bytes, error_kind, error_status, perf_time
from kvmigrate.litellm_bridge.chains import Chained, PluginChains, router_group_of
from kvmigrate.litellm_bridge.copies import PluginCopies
from kvmigrate.litellm_bridge.ids import ResponseIds, litellm_unwrap
from kvmigrate.litellm_bridge.messages import messages_answer
from kvmigrate.litellm_bridge.request import (
    answered_group,
    call_id,
    client_body,
    forwarded_body,
    model_group,
    request_headers,
    route_of,
)
from kvmigrate.litellm_bridge.routed import Routed, exchange_of
from kvmigrate.litellm_bridge.shadow import RouterLike
from kvmigrate.policies import Route
from kvmigrate.policies.conversation import declared_key
from kvmigrate.policies.outcome import worth_a_shadow_copy
from kvmigrate.proxy.cohorts import CohortResolver
from kvmigrate.proxy.exchange import SERVE, Exchange
from kvmigrate.proxy.unserved import UnservedRoutes, blame
from kvmigrate.recorder.addon import RecorderAddon, build_recorder
from kvmigrate.rollout.controller import initial_state
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.store import open_store, store_keys

if TYPE_CHECKING:
    _CustomLogger = object
else:
    try:
        from litellm.integrations.custom_logger import CustomLogger as _CustomLogger
    except ImportError:  # kvmigrate without the `litellm` extra: the class still works
        _CustomLogger = object

log = logging.getLogger("kvmigrate.litellm_bridge.plugin")

CONFIG_ENV_VAR = "KVMIGRATE_CONFIG"
BACKEND_HEADER = "x-kvmigrate-backend"
# The store generation (every cohort's rollout version, summed) this plugin routes by, on
# every response: a rollout change has reached this LiteLLM process once it is at least the
# store's generation after the change.
GENERATION_HEADER = "x-kvmigrate-rollout-generation"
METADATA_KEY = "kvmigrate_backend"
# Beside it: the backend of each model group of the request's model, so the response header
# names the backend that answered when LiteLLM fell back to another group.
GROUPS_KEY = "kvmigrate_groups"
# Requests routed but not yet finished; beyond this the oldest are forgotten (a client
# that disconnects mid-stream may never produce a success or failure event).
MAX_PENDING = 20_000


class KvmigrateRouter(_CustomLogger):
    """A LiteLLM `CustomLogger` applying kvmigrate's rollout (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        router: RouterLike | None = None,
        record: bool = True,
        poll_interval: float = 0.25,
    ) -> None:
        super().__init__()
        self.config = config
        self._router = router
        self.store = open_store(config.rollout.state, initial_state(config))
        self.live = LiveRollout(config, self.store, poll_interval=poll_interval)
        self.identity = ContinuityResolver(self.store, config.rollout.pin_ttl_seconds)
        self.cohorts = CohortResolver(config)
        self.recorder: RecorderAddon | None = (
            build_recorder(config, store_keys(self.store)) if record else None
        )
        self.chains = PluginChains(
            self.identity, ResponseIds(litellm_unwrap()), router_group_of(self._llm_router)
        )
        self.unserved = UnservedRoutes()
        self.copies = PluginCopies(
            config, self.chains, self._llm_router, self._record, self.unserved
        )
        self._pending: OrderedDict[str, Routed] = OrderedDict()
        self._start: asyncio.Task[None] | None = None
        self.hook_errors = 0
        with contextlib.suppress(RuntimeError):  # inside LiteLLM's startup: start now
            self._begin(asyncio.get_running_loop())
        atexit.register(self.close)

    # -- LiteLLM hooks ----------------------------------------------------------------------

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        try:
            await self.route(data, call_type)
        except Exception:
            self.hook_errors += 1
            log.exception("kvmigrate: routing failed; LiteLLM routes this request itself")
        return data

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        try:
            self.finished(kwargs, response_obj, None, start_time, end_time)
        except Exception:
            self.hook_errors += 1
            log.exception("kvmigrate: recording a LiteLLM answer failed")

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        try:
            exc = kwargs.get("exception") or RuntimeError("LiteLLM call failed")
            self.finished(kwargs, None, exc, start_time, end_time)
        except Exception:
            self.hook_errors += 1
            log.exception("kvmigrate: recording a LiteLLM failure failed")

    async def async_post_call_success_hook(
        self, data: dict[str, Any], user_api_key_dict: Any, response: Any
    ) -> None:
        try:
            key = call_id(data)
            routed = self._pending.get(key) if key is not None else None
            if routed is not None:
                self.copies.seen(routed, response)
        except Exception:
            self.hook_errors += 1
            log.exception("kvmigrate: reading a Responses answer's id failed")

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncIterator[Any]:
        """A Responses stream's id, from its first event, before the client has it."""
        key = call_id(request_data)
        routed = self._pending.get(key) if key is not None else None
        watching = routed is not None and routed.chain is not None
        async for chunk in response:
            if watching:
                assert routed is not None
                try:
                    watching = not self.copies.seen(routed, chunk)
                except Exception:
                    watching = False
                    self.hook_errors += 1
                    log.exception("kvmigrate: reading a Responses stream's id failed")
            yield chunk

    async def async_post_call_response_headers_hook(
        self,
        data: dict[str, Any],
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, Any] | None = None,
    ) -> dict[str, str] | None:
        try:
            await self._started()
            headers = {GENERATION_HEADER: str(self.live.generation)}
            for key in ("metadata", "litellm_metadata"):
                meta = data.get(key)
                if isinstance(meta, Mapping) and isinstance(meta.get(METADATA_KEY), str):
                    headers[BACKEND_HEADER] = _answered_by(meta, response)
                    break
            return headers
        except Exception:
            self.hook_errors += 1
        return None

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> None:
        """The request failed for good (LiteLLM awaits every attempt's failure event before
        this): forget it, and record the candidate refusals no primary answer followed."""
        try:
            key = call_id(request_data)
            routed = self._pending.pop(key, None) if key is not None else None
            for refused in routed.refused if routed is not None else ():
                self._answered(refused)
            if routed is not None:
                self.copies.none(routed)
        except Exception:
            self.hook_errors += 1
            log.exception("kvmigrate: ending a failed LiteLLM call failed")

    # -- routing ----------------------------------------------------------------------------

    async def route(self, data: dict[str, Any], call_type: Any) -> Route | None:
        """Decide for one request and point `data["model"]` at the chosen model group."""
        route = route_of(call_type)
        model = data.get("model")
        if route is None or not isinstance(model, str):
            return None
        model_route = self.config.route(model)
        if model_route is None:
            return None
        await self._started()
        body = client_body(data)
        served = model_route.served
        identity, chosen, cohort, chained = await self._decide(data, body, model, route, served)
        group = served.get(chosen.serve)
        if group is None:
            return None
        data["model"] = group
        fallback = served.get(chosen.fallback) if chosen.fallback else None
        if fallback is not None and "fallbacks" not in data:
            data["fallbacks"] = [fallback]
        for name in ("metadata", "litellm_metadata"):
            meta = data.get(name)
            if isinstance(meta, dict):
                meta[METADATA_KEY] = chosen.serve
                meta[GROUPS_KEY] = {group: backend for backend, group in served.items()}
        key = call_id(data)
        if key is not None:
            stream = bool(body.get("stream"))
            # Copies and records carry OpenAI's fields only (see forwarded_body).
            sent = forwarded_body(body, route)
            conversation, turn = identity.conversation, identity.turn
            self._pending[key] = Routed(
                route,
                model,
                conversation,
                turn,
                stream,
                chosen,
                served,
                sent,
                identity,
                cohort,
                chained=chained,
            )
            if route == "responses":
                self._pending[key].chain = self.chains.turn(identity, sent, chained)
            if len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
        return chosen

    async def _decide(
        self,
        data: Mapping[str, Any],
        body: dict[str, Any],
        model: str,
        route: str,
        served: dict[str, str],
    ) -> tuple[Identity, Route, str, Chained | None]:
        """The request's conversation, route and cohort, as the proxy decides them: a
        Responses request continuing a stored response goes where it is stored."""
        headers = request_headers(data)
        cohort = self.cohorts.resolve(model, CIMultiDictProxy(CIMultiDict(headers)), body)
        chained = self.chains.chained(body) if route == "responses" else None
        if chained is None:
            identity = await self.identity.identify(headers, body, model, route)
            chosen = await self.live.route(identity.conversation, identity.turn, served, cohort)
            return identity, chosen, cohort, None
        declared = declared_key(headers, body, route)
        identity, chosen = await self.chains.route(
            chained,
            served,
            lambda c, t: self.live.route(c, t, served, cohort),
            declared.value if declared else None,
        )
        return identity, chosen, cohort, chained

    # -- recording and copies ---------------------------------------------------------------

    def finished(
        self,
        kwargs: Mapping[str, Any],
        response_obj: Any,
        exc: BaseException | None,
        start_time: Any,
        end_time: Any,
    ) -> Exchange | None:
        """Record one finished attempt of a routed call, then start its copies. LiteLLM logs
        every attempt (its retries, its fallback) under the call's id: a failure keeps the
        entry for the attempts that may follow, until the answer or the post-call failure
        hook ends it."""
        key = kwargs.get("litellm_call_id")
        routed = self._pending.get(key) if isinstance(key, str) else None
        if routed is None or not isinstance(key, str):
            return None  # not routed by us: a copy, a health check, another route
        if exc is None:
            self._pending.pop(key, None)
        exchange = self._attempt(routed, key, kwargs, response_obj, exc, start_time, end_time)
        self._settle_refusals(routed, exchange)
        exchange.has_shadow_copy = self._shadows(routed, exchange)
        if self._is_refusal(routed, exchange):
            routed.refused.append(exchange)  # whose refusal, the primary's outcome says
        else:
            self._answered(exchange)
        if exchange.has_shadow_copy:
            routed.has_shadow_copy = True
            self.copies.send(routed, exchange)
        elif exc is None:
            self.copies.none(routed)
        return exchange

    def _attempt(
        self,
        routed: Routed,
        key: str,
        kwargs: Mapping[str, Any],
        response_obj: Any,
        exc: BaseException | None,
        start_time: Any,
        end_time: Any,
    ) -> Exchange:
        chosen = routed.route
        backend, fallback_from = chosen.serve, None
        if chosen.fallback and model_group(kwargs) == routed.served.get(chosen.fallback):
            backend, fallback_from = chosen.fallback, chosen.serve
        # Record ids are unique: the answer keeps the call's, each failed attempt is numbered.
        request_id = "llm_" + key
        if exc is not None:
            routed.attempts += 1
            request_id += f"-{routed.attempts}"
        now_wall, now_perf = time.time(), time.perf_counter()
        started = perf_time(kwargs.get("api_call_start_time") or start_time, now_wall, now_perf)
        exchange = exchange_of(routed, backend, SERVE, request_id)
        exchange.started = now_perf if started is None else started
        exchange.finished = perf_time(end_time, now_wall, now_perf) or now_perf
        exchange.fallback_from = fallback_from
        exchange.request_body = orjson.dumps(routed.body)
        if exc is None:
            exchange.status = 200
            exchange.first_byte = perf_time(kwargs.get("completion_start_time"), now_wall, now_perf)
            logged = kwargs.get("standard_logging_object")
            logged = logged if isinstance(logged, Mapping) else None
            answer = answer_bytes(response_obj, logged)
            if routed.path == "messages":  # logged as a chat completion (litellm_messages)
                answer = messages_answer(kwargs, orjson.loads(answer))
            exchange.chunks.append(answer)
        else:
            exchange.status = error_status(exc)
            exchange.error = error_kind(exc)
        return exchange

    def _shadows(self, routed: Routed, exchange: Exchange) -> bool:
        """As kvmigrate's proxy decides: the primary's answer earns copies, once per
        request; a failure LiteLLM may retry (5xx, 429, transport) does not, unless
        `rollout.shadow_primary_failures` says so."""
        chosen = routed.route
        if chosen.shadow is None or routed.has_shadow_copy or exchange.backend != chosen.serve:
            return False
        return exchange.error is None or (
            self.config.rollout.shadow_primary_failures
            or worth_a_shadow_copy(exchange.status, None)
        )

    def _is_refusal(self, routed: Routed, exchange: Exchange) -> bool:
        """A candidate's 4xx but 429, which LiteLLM falls back from to the primary."""
        chosen = routed.route
        return (
            exchange.error is not None
            and exchange.fallback_from is None
            and chosen.fallback is not None
            and self.unserved.refusal(exchange.backend, exchange.route, exchange.status) is not None
        )

    def _settle_refusals(self, routed: Routed, primary: Exchange) -> None:
        """Record the candidate's held refusals once the primary's attempt ended: they are
        the candidate's error (`rejected`) where the primary answered the same request."""
        if primary.fallback_from is None:
            return
        for refused in routed.refused:
            kind = self.unserved.refusal(refused.backend, refused.route, refused.status)
            refused.error = blame(kind, primary.status) or refused.error
            self._answered(refused)
        routed.refused.clear()

    def _answered(self, exchange: Exchange) -> None:
        self.identity.exchange_done(exchange)
        self.chains.map.exchange_done(exchange)
        self._record(exchange)

    def _record(self, exchange: Exchange) -> None:
        if self.recorder is not None:
            self.recorder.exchange_done(exchange)

    def _llm_router(self) -> RouterLike | None:
        if self._router is not None:
            return self._router
        try:
            proxy_server = importlib.import_module("litellm.proxy.proxy_server")
        except ImportError:
            return None
        router: RouterLike | None = getattr(proxy_server, "llm_router", None)
        return router

    # -- lifecycle --------------------------------------------------------------------------

    def _begin(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._start is None:
            self._start = loop.create_task(self._run_start())

    async def _run_start(self) -> None:
        if self.recorder is not None:
            self.recorder.start()
        await self.live.running()
        await self.identity.running()

    async def _started(self) -> None:
        """Started once, on LiteLLM's loop: the first request waits for the first read of
        the rollout store, every later one passes straight through."""
        start = self._start
        if start is None:
            self._begin(asyncio.get_running_loop())
            start = self._start
            assert start is not None
        if not start.done():
            await asyncio.shield(start)

    async def aclose(self) -> None:
        """Stop watching the store, let copies finish briefly, flush the recorder."""
        await self.copies.close()
        await self.live.done()
        await self.identity.done()
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Flush the recorder and close the store; safe to call more than once (atexit)."""
        if self.recorder is not None:
            self.recorder.close(self.recorder.stop_timeout)
        with contextlib.suppress(Exception):
            self.store.close()


def _answered_by(meta: Mapping[str, Any], response: object) -> str:
    """The backend whose model group gave `response`; the routed one when LiteLLM did not
    say (or the group is none of the model's)."""
    groups = meta.get(GROUPS_KEY)
    group = answered_group(response)
    backend = groups.get(group) if isinstance(groups, Mapping) and group is not None else None
    return backend if isinstance(backend, str) else str(meta[METADATA_KEY])


def from_env(env: Mapping[str, str] | None = None) -> KvmigrateRouter:
    """The plugin for the kvmigrate config at `$KVMIGRATE_CONFIG` (default ./config.yaml)."""
    env = os.environ if env is None else env
    return KvmigrateRouter(load_config(env.get(CONFIG_ENV_VAR) or "config.yaml", env))


_instance: KvmigrateRouter | None = None


def __getattr__(name: str) -> Any:
    # `proxy_handler_instance` is made on first access, i.e. when LiteLLM loads the
    # callback, never on a plain import of this module (tests, type checks, tooling).
    global _instance
    if name == "proxy_handler_instance":
        if _instance is None:
            _instance = from_env()
        return _instance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
