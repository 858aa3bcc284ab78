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

from kvmigrate import bytescan
from kvmigrate.exchange import Exchange
from kvmigrate.percentile import percentile
from kvmigrate.policies import Mode
from kvmigrate.policies.gates import rollback_reason
from kvmigrate.policies.outcome import is_backend_error, latency_counts
from kvmigrate.policies.tool_calls import TOOL_ROUTES, invalid_tool_calls
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.controller import RolloutController, RolloutError
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.state import RolloutState
from kvmigrate.rollout.store import StoreError
from kvmigrate.slices import run_through

if TYPE_CHECKING:
    from kvmigrate.exchange import Exchange

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
        # Calls started before the last clear ran under the state it cleared: a request
        # sent before a rollback that fails after it is no evidence against the new state
        # (it rolled one cohort back twice for one breach).
        self.since = float("-inf")

    def add(
        self, at: float, failed: bool, ttft: float | None, duration: float | None = None
    ) -> None:
        if at >= self.since:
            self.samples.append((at, failed, ttft, duration))

    def add_tools(self, at: float, total: int, invalid: int) -> None:
        if at >= self.since:
            self.tools.append((at, total, invalid))

    def clear(self) -> None:
        self.samples.clear()
        self.tools.clear()
        self.since = time.perf_counter()

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
    """Judges each cohort on its own traffic: a breach in one cohort rolls back that cohort
    alone, and the others keep their share."""

    def __init__(
        self, live: LiveRollout, controller: RolloutController, interval: float = 1.0
    ) -> None:
        self.live = live
        self.supervisor = live.supervisor
        self.controller = controller
        self.interval = interval
        config = controller.config
        self._primary = config.rollout.primary
        # (cohort, backend) -> its window; cohorts and backends from the config (bounded).
        self.windows = {
            (cohort, backend): RollingWindow(backend)
            for cohort in live.cohorts or ("",)
            for backend in (self._primary, *config.candidates_of(cohort))
        }
        self.actor = f"auto-rollback@{socket.gethostname()}"
        self._unchecked: deque[Exchange] = deque(maxlen=2_000)
        self._task: asyncio.Task[None] | None = None
        self._counter: Counter | None = None
        live.on_change(self._state_changed)

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self._counter = Counter(
            "kvmigrate_auto_rollbacks",
            "Rollbacks this proxy made by itself.",
            ["cohort"],
            registry=registry,
        )

    def exchange_done(self, exchange: Exchange) -> None:
        window = self.windows.get((exchange.cohort, exchange.backend))
        if window is None:
            return
        if (
            exchange.backend != self._primary
            and exchange.route in TOOL_ROUTES
            and bytescan.contains(exchange.request_body, b'"tools"')
        ):
            self._unchecked.append(exchange)  # parsed off the response path, once a second
        failed = is_backend_error(exchange.status, exchange.error)
        duration = exchange.duration if latency_counts(exchange.status, exchange.error) else None
        window.add(exchange.started, failed, exchange.ttft, duration)

    async def running(self) -> None:
        self._task = self.supervisor.start("auto-rollback", self._loop)

    async def done(self) -> None:
        await self.supervisor.stop(self._task)

    def _state_changed(self, cohort: str, state: RolloutState) -> None:
        # Evidence gathered under the old state says nothing about the new one; the other
        # cohorts' evidence still holds.
        for (of, _backend), window in self.windows.items():
            if of == cohort:
                window.clear()
        kept = [x for x in self._unchecked if x.cohort != cohort]
        self._unchecked.clear()
        self._unchecked.extend(kept)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self._unchecked:
                await asyncio.to_thread(self.check_tool_calls)
            for cohort, reason in self.check():
                await self._roll_back(cohort, reason)

    def check_tool_calls(self) -> None:
        """Count the candidate's broken tool calls (unknown tool, invalid JSON arguments)."""
        while self._unchecked:
            exchange = self._unchecked.popleft()
            window = self.windows.get((exchange.cohort, exchange.backend))
            # In slices: on this thread, a long answer decoded at once held the GIL, and so
            # the event loop, for as long as that took.
            response = run_through(exchange.answer_in_slices())
            try:
                request = orjson.loads(exchange.request_body)
            except orjson.JSONDecodeError:
                continue
            if window is not None and response is not None and isinstance(request, dict):
                total, invalid = invalid_tool_calls(request, response)
                if total:
                    window.add_tools(exchange.started, total, invalid)

    def check(self) -> list[tuple[str, str]]:
        """(cohort, reason) of every cohort in split whose candidate breaches the limits."""
        config = self.controller.config.rollout
        since = time.perf_counter() - config.auto_rollback.window_seconds
        breaches = []
        for cohort in self.live.cohorts or ("",):
            # The snapshot, not the stored state: a share whose candidate the config no
            # longer lists serves no one (RolloutState.of_candidates), so nothing to judge.
            snapshot = self.live.current(cohort)
            if snapshot.mode != Mode.SPLIT or snapshot.percent == 0:
                continue
            serving = snapshot.candidate  # the one its split serves
            if (cohort, serving) not in self.windows:
                continue
            primary = self.windows[cohort, self._primary].summary(since)
            candidate = self.windows[cohort, serving].summary(since)
            reason = rollback_reason(primary, candidate, config.auto_rollback)
            if reason is not None:
                breaches.append((cohort, reason))
        return breaches

    async def _roll_back(self, cohort: str, reason: str) -> None:
        version = self.live.state_of(cohort).version
        try:
            outcome = await asyncio.to_thread(
                self.controller.rollback, reason, self.actor, True, version, cohort or None
            )
        except RolloutError as exc:
            log.info("auto-rollback of %s skipped: %s", cohort, exc)
            return
        except StoreError as exc:
            log.error("auto-rollback could not write the rollout store: %s", exc)
            return
        if self._counter is not None:
            self._counter.labels(cohort).inc()
        log.warning(
            "auto-rollback of %s: %s; percent %g -> %g",
            cohort,
            reason,
            outcome.event.from_percent,
            outcome.event.to_percent,
        )
        self._state_changed(cohort, outcome.state)
