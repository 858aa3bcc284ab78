"""Auto-rollback: every proxy watches a rolling window and pulls a failing candidate out.

Outcomes are appended to bounded in-memory windows on the response path (a deque append);
the verdict is computed once a second in the background by the same pure function the
tests check (`rollback_reason`), and the rollback goes through the controller, so it is
recorded in the history like any other change.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from typing import TYPE_CHECKING

import orjson
from prometheus_client import CollectorRegistry, Counter

from kvmigrate.exchange import Exchange
from kvmigrate.percentile import percentile
from kvmigrate.policies import Mode
from kvmigrate.policies.gates import rollback_reason
from kvmigrate.policies.outcome import is_backend_error
from kvmigrate.policies.tool_calls import TOOL_ROUTES, invalid_tool_calls
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.controller import RolloutController, RolloutError
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.state import RolloutState
from kvmigrate.rollout.store import StoreError
from kvmigrate.wire.assemble import assemble

if TYPE_CHECKING:
    from kvmigrate.proxy.exchange import Exchange

log = logging.getLogger("kvmigrate.rollout")

MAX_SAMPLES = 50_000


class RollingWindow:
    """(time, failed, ttft) of recent upstream calls of one backend, and (time, tool calls,
    invalid ones) of its answers to requests that offered tools."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.samples: deque[tuple[float, bool, float | None, float | None]] = deque(
            maxlen=MAX_SAMPLES
        )
        self.tools: deque[tuple[float, int, int]] = deque(maxlen=MAX_SAMPLES)

    def add(
        self, at: float, failed: bool, ttft: float | None, duration: float | None = None
    ) -> None:
        self.samples.append((at, failed, ttft, duration))

    def clear(self) -> None:
        self.samples.clear()
        self.tools.clear()

    def summary(self, since: float) -> BackendWindow:
        for samples in (self.samples, self.tools):
            while samples and samples[0][0] < since:
                samples.popleft()
        ttfts = [t for _, _, t, _ in self.samples if t is not None]
        durations = [d for _, _, _, d in self.samples if d is not None]
        errors = sum(1 for _, failed, _, _ in self.samples if failed)
        return BackendWindow(
            self.name,
            requests=len(self.samples),
            errors=errors,
            ttft_p50=percentile(ttfts, 50),
            ttft_p95=percentile(ttfts, 95),
            latency_p95=percentile(durations, 95),
            tool_calls=sum(total for _, total, _ in self.tools),
            invalid_tool_calls=sum(bad for _, _, bad in self.tools),
        )


class RollbackWatcher:
    def __init__(
        self, live: LiveRollout, controller: RolloutController, interval: float = 1.0
    ) -> None:
        self.live = live
        self.supervisor = live.supervisor
        self.controller = controller
        self.interval = interval
        rollout = controller.config.rollout
        self.windows = {
            rollout.primary: RollingWindow(rollout.primary),
            rollout.candidate: RollingWindow(rollout.candidate),
        }
        self.actor = f"auto-rollback@{socket.gethostname()}"
        self._candidate = rollout.candidate
        self._unchecked: deque[Exchange] = deque(maxlen=2_000)
        self._task: asyncio.Task[None] | None = None
        self._counter: Counter | None = None
        live.on_change(self._state_changed)

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self._counter = Counter(
            "kvmigrate_auto_rollbacks", "Rollbacks this proxy made by itself.", registry=registry
        )

    def exchange_done(self, exchange: Exchange) -> None:
        window = self.windows.get(exchange.backend)
        if (
            window is not None
            and exchange.backend == self._candidate
            and exchange.route in TOOL_ROUTES
            and b'"tools"' in exchange.request_body
        ):
            self._unchecked.append(exchange)  # parsed off the response path, once a second
        if window is not None:
            failed = is_backend_error(exchange.status, exchange.error)
            window.add(exchange.started, failed, exchange.ttft, exchange.duration)

    async def running(self) -> None:
        self._task = self.supervisor.start("auto-rollback", self._loop)

    async def done(self) -> None:
        await self.supervisor.stop(self._task)

    def _state_changed(self, state: RolloutState) -> None:
        # Evidence gathered under the old state says nothing about the new one.
        for window in self.windows.values():
            window.clear()
        self._unchecked.clear()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self._unchecked:
                await asyncio.to_thread(self.check_tool_calls)
            reason = self.check()
            if reason is not None:
                await self._roll_back(reason)

    def check_tool_calls(self) -> None:
        """Count the candidate's broken tool calls (unknown tool, invalid JSON arguments)."""
        window = self.windows[self._candidate]
        while self._unchecked:
            exchange = self._unchecked.popleft()
            response = assemble(exchange.route, exchange.body())
            try:
                request = orjson.loads(exchange.request_body)
            except orjson.JSONDecodeError:
                continue
            if response is not None and isinstance(request, dict):
                total, invalid = invalid_tool_calls(request, response)
                if total:
                    window.tools.append((exchange.started, total, invalid))

    def check(self) -> str | None:
        state = self.live.state
        if state.mode != Mode.SPLIT or state.percent == 0:
            return None
        config = self.controller.config.rollout
        since = time.perf_counter() - config.auto_rollback.window_seconds
        primary = self.windows[config.primary].summary(since)
        candidate = self.windows[config.candidate].summary(since)
        return rollback_reason(primary, candidate, config.auto_rollback)

    async def _roll_back(self, reason: str) -> None:
        version = self.live.state.version
        try:
            outcome = await asyncio.to_thread(
                self.controller.rollback, reason, self.actor, True, version
            )
        except RolloutError as exc:
            log.info("auto-rollback skipped: %s", exc)
            return
        except StoreError as exc:
            log.error("auto-rollback could not write the rollout store: %s", exc)
            return
        if self._counter is not None:
            self._counter.inc()
        log.warning(
            "auto-rollback: %s; percent %g -> %g",
            reason,
            outcome.event.from_percent,
            outcome.event.to_percent,
        )
        self._state_changed(outcome.state)
