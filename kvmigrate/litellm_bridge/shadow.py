"""Copies of a LiteLLM request to another model group, in the background, always accounted.

A copy goes through LiteLLM's own router (credentials, retries and deployments of the
group stay LiteLLM's business), streams when the client streamed (so the candidate's TTFT
is measured) and is read to the end. Copies start only after the primary answered, so they
never compete with it; at the concurrency bound new copies are dropped and counted, never
queued.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kvmigrate.exchange import Exchange
from kvmigrate.litellm_bridge.answer import answer_bytes, error_kind, error_status, sse_event
from kvmigrate.policies.outcome import ErrorKind
from kvmigrate.tasks import BoundedTasks, Work

log = logging.getLogger("kvmigrate.litellm_bridge.plugin")


class RouterLike(Protocol):
    """What the plugin calls on LiteLLM's `Router` (litellm.proxy.proxy_server.llm_router)."""

    async def acompletion(self, **kwargs: Any) -> Any: ...

    async def aresponses(self, **kwargs: Any) -> Any: ...

    async def aanthropic_messages(self, **kwargs: Any) -> Any: ...


RouterSource = Callable[[], RouterLike | None]
Done = Callable[[Exchange], None]
# The body a copy sends, made when it starts (it may wait for an earlier copy's answer);
# None: the copy is not sent.
Prepare = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]


async def call_group(router: RouterLike, route: str, body: dict[str, Any]) -> Any:
    if route == "responses":
        return await router.aresponses(**body)
    if route == "messages":
        return await router.aanthropic_messages(**body)
    return await router.acompletion(**body)


@dataclass(frozen=True, slots=True)
class _Copy:
    exchange: Exchange
    group: str
    body: dict[str, Any]
    judge: Done | None
    prepare: Prepare | None


class ShadowCopies:
    def __init__(
        self, router: RouterSource, done: Done, max_concurrency: int, timeout: float
    ) -> None:
        self._router = router
        self._done = done
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.started = 0
        self.dropped: Counter[str] = Counter()
        self._tasks = BoundedTasks(max_concurrency, lambda: self._drop("concurrency_limit"))

    @property
    def inflight(self) -> int:
        return len(self._tasks)

    def dispatch(
        self,
        exchange: Exchange,
        group: str,
        body: dict[str, Any],
        judge: Done | None = None,
        prepare: Prepare | None = None,
    ) -> bool:
        """Start a copy of `body` (as `prepare` makes it) to `group`, recorded as `exchange`
        when it ends, after `judge` has said what its outcome means. Never raises, never
        waits."""
        copy = _Copy(exchange, group, body, judge, prepare)
        return self._tasks.start(lambda: self._copy_task(copy))

    def _copy_task(self, copy: _Copy) -> Work | None:
        router = self._router()
        if router is None:
            self._drop("no_router")
            return None
        self.started += 1
        return self._run(router, copy)

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    async def _run(self, router: RouterLike, copy: _Copy) -> None:
        exchange, group, body, judge = copy.exchange, copy.group, copy.body, copy.judge
        if copy.prepare is not None:
            try:
                prepared = await copy.prepare(body)
            except Exception:  # as a failed copy: never surfaces
                log.exception("preparing a shadow copy to %s failed", group)
                prepared = None
            if prepared is None:
                self._drop("no_candidate_chain")
                return
            body = prepared
        try:
            await asyncio.wait_for(self._copy(router, exchange, group, body), self.timeout)
        except TimeoutError:
            self.dropped["timeout"] += 1
            exchange.error = exchange.error or ErrorKind.TIMEOUT
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed copy must never surface anywhere
            self.dropped["error"] += 1
            exchange.error = exchange.error or error_kind(exc)
            exchange.status = exchange.status or error_status(exc)
            log.debug("shadow copy to %s failed: %r", group, exc)
        exchange.finished = exchange.finished or time.perf_counter()
        try:
            if judge is not None:
                judge(exchange)
            self._done(exchange)
        except Exception:
            log.exception("recording a shadow copy failed")

    async def _copy(
        self, router: RouterLike, exchange: Exchange, group: str, body: dict[str, Any]
    ) -> None:
        exchange.started = time.perf_counter()
        result = await call_group(router, exchange.route, {**body, "model": group})
        if hasattr(result, "__aiter__"):
            async for event in result:
                if exchange.first_byte is None:
                    exchange.first_byte = time.perf_counter()
                exchange.chunks.append(sse_event(event))
            exchange.finished = time.perf_counter()
        else:
            exchange.first_byte = exchange.finished = time.perf_counter()
            exchange.chunks.append(answer_bytes(result))
        exchange.status = 200

    async def close(self, grace: float = 1.0) -> None:
        """Give in-flight copies a moment, then cancel the rest (shutdown must not hang)."""
        await self._tasks.close(grace)


def copy_id() -> str:
    return "req_" + os.urandom(12).hex()
