"""Long-lived background loops that cannot die silently.

A loop that raises is logged with its traceback, counted
(`kvmigrate_background_restarts_total{task}`) and started again after a backoff that doubles
while it keeps failing. Before, the rollout watcher ended on any exception but a store error,
and the proxy then stopped following rollout changes without a word.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger("kvmigrate.supervisor")

# A loop that ran this long before failing starts again from the shortest backoff.
HEALTHY_RUN_S = 60.0


class Supervisor:
    """Starts supervised loops. An addon: it registers the restart counter with the proxy's
    metrics; the loops it starts are ended by cancelling their tasks."""

    def __init__(self, backoff_s: float = 0.5, max_backoff_s: float = 30.0) -> None:
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.restarts: collections.Counter[str] = collections.Counter()
        self._counter: Counter | None = None

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self._counter = Counter(
            "kvmigrate_background_restarts",
            "Background loops restarted after an unexpected failure, by task.",
            ["task"],
            registry=registry,
        )

    def start(self, name: str, run: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Run `run()` on the running loop until it returns or its task is cancelled."""
        return asyncio.get_running_loop().create_task(self._supervise(name, run), name=name)

    @staticmethod
    async def stop(task: asyncio.Task[None] | None) -> None:
        """End a loop `start` returned (None: never started) and wait until it has."""
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _supervise(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        backoff = self.backoff_s
        while True:
            started = loop.time()
            try:
                await run()
                return
            except Exception:
                self.restarts[name] += 1
                if self._counter is not None:
                    self._counter.labels(name).inc()
                if loop.time() - started > HEALTHY_RUN_S:
                    backoff = self.backoff_s
                log.exception("background task %s failed; restarting in %.1fs", name, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)
