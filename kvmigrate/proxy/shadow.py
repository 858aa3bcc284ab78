"""Shadow copies to the candidate: bounded, detached from the client, and always accounted.

A copy runs as a background task, or as a flight collected by its answer's callbacks
(`copy_flight`), that the dispatcher keeps referenced until it ends. When the bound is
reached, new copies are dropped and counted rather than queued, so a slow candidate can never
grow the proxy's memory or delay the primary.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kvmigrate.config import Config
from kvmigrate.proxy.metrics import ProxyMetrics
from kvmigrate.tasks import BoundedTasks, Flight, Work

log = logging.getLogger("kvmigrate.proxy.shadow")


class RateBudget:
    """A token bucket: at most `rate` per second on average, bursts up to one minute's worth.
    Noise calls cost the primary's (hosted) tokens, so they are budgeted."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate * 60.0)
        self._tokens = self.capacity if rate > 0 else 0.0
        self._clock = clock
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class ShadowDispatcher:
    def __init__(
        self, max_concurrency: int, metrics: ProxyMetrics, timeout: float, max_bytes: int
    ) -> None:
        """At most `max_concurrency` copies in flight, holding at most `max_bytes` of
        request bodies: a candidate that answers slowly holds its copies for up to `timeout`,
        and 64 copies of 32 MiB agent contexts (images inlined) would be 2 GiB."""
        self.max_concurrency = max_concurrency
        self._metrics = metrics
        self._tasks = BoundedTasks(
            max_concurrency,
            lambda: metrics.shadow_dropped.labels("concurrency_limit").inc(),
            deadline=timeout,
            on_overdue=metrics.shadow_dropped.labels("timeout").inc,
            byte_limit=max_bytes,
            on_over_bytes=metrics.shadow_dropped.labels("bytes_limit").inc,
        )

    @property
    def inflight(self) -> int:
        return len(self._tasks)

    def dispatch(self, make_copy: Callable[[], Work | Flight | None], size: int) -> bool:
        """Start a shadow copy of a `size`-byte body unless a bound is reached: `make_copy`
        returns its coroutine, or its flight already sent, or None for no copy. Never
        raises, never waits."""
        return self._tasks.start(lambda: self._started(make_copy), size)

    def hold(self, extra: int) -> bool:
        """Whether the copy running as the current task may hold `extra` more bytes (a body
        it had to grow), within the bound; they count until it ends."""
        task = asyncio.current_task()
        return task is not None and self._tasks.grow(task, extra)

    def _started(self, make_copy: Callable[[], Work | Flight | None]) -> Work | Flight | None:
        try:
            copy = make_copy()
        except Exception:
            self.failed()
            return None
        return self._run(copy) if asyncio.iscoroutine(copy) else copy

    async def _run(self, copy: Work) -> None:
        # Past `timeout` the task is cancelled, and counted, by BoundedTasks' sweep.
        try:
            await copy
        except Exception:  # not a cancellation (a BaseException): that ends the task
            self.failed()

    def failed(self) -> None:
        """A copy raised (called inside its except block): counted and logged."""
        self._metrics.shadow_dropped.labels("error").inc()
        log.exception("shadow copy failed")

    async def close(self, grace: float = 1.0) -> None:
        """Give in-flight copies a moment, then cancel the rest (shutdown must not hang)."""
        await self._tasks.close(grace)


def candidate_dispatchers(
    config: Config, metrics: ProxyMetrics, timeout: float
) -> tuple[ShadowDispatcher, dict[str, ShadowDispatcher]]:
    """The dispatcher of rollout.candidate (noise calls go through it too), and one for
    every further candidate (models[].candidates): each has a budget of its own, so a slow
    one cannot starve the others' copies. One gauge counts them all."""
    bound, max_bytes = config.rollout.shadow_max_concurrency, config.rollout.shadow_max_bytes
    default = ShadowDispatcher(bound, metrics, timeout, max_bytes)
    further = {b for m in config.models for b in m.candidates} - {config.rollout.candidate}
    others = {b: ShadowDispatcher(bound, metrics, timeout, max_bytes) for b in sorted(further)}
    every = (default, *others.values())
    # Read when scraped: counting on every copy's start and end cost a lock each time.
    metrics.gauge_function(
        "kvmigrate_shadow_inflight",
        "Shadow copies in flight.",
        lambda: sum(dispatcher.inflight for dispatcher in every),
    )
    return default, others
