"""Background tasks on the event loop, bounded: what the proxy's shadow copies and the LiteLLM
plugin's copies run as.

Each task stays referenced until it ends (the loop keeps only weak references). At the bound
a new task is refused and counted, never queued, so a slow backend can neither grow memory
nor delay anything on the response path. Closing waits a moment for the tasks in flight and
then cancels the rest, so shutdown never hangs (as uvicorn's graceful-shutdown timeout).

With a `deadline`, a task still running that long after its start is cancelled and counted.
One sweep a fraction of the deadline apart does that for all of them: an `asyncio.timeout`
per task cost the proxy about 4 us of CPU per shadow copy, for a bound that rarely fires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

Work = Coroutine[Any, Any, None]


class BoundedTasks:
    def __init__(
        self,
        limit: int,
        on_refused: Callable[[], None],
        *,
        deadline: float | None = None,
        on_overdue: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_refused` counts a task refused at the bound; `on_overdue` counts a task
        cancelled at its `deadline` (seconds after its start, give or take a quarter of it,
        at most a second)."""
        self.limit = limit
        self._on_refused = on_refused
        self._tasks: dict[asyncio.Task[None], float] = {}  # each task's start
        self._deadline = deadline
        self._on_overdue = on_overdue
        self._overdue: set[asyncio.Task[None]] = set()
        self._sweep: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, make: Callable[[], Work | None]) -> bool:
        """Run what `make()` returns as a task, unless the bound is reached (`make` is then
        not called) or `make` returns None. Never raises, never waits."""
        if len(self._tasks) >= self.limit:
            self._on_refused()
            return False
        loop = asyncio.get_running_loop()
        work = make()
        if work is None:
            return False
        task = loop.create_task(work)
        self._tasks[task] = loop.time()
        task.add_done_callback(self._finished)
        if self._deadline is not None and self._sweep is None:
            self._sweep = loop.call_later(_sweep_interval(self._deadline), self._cancel_overdue)
        return True

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        if task in self._overdue:
            self._overdue.discard(task)
            self._on_overdue()

    def _cancel_overdue(self) -> None:
        self._sweep = None
        if self._deadline is None or not self._tasks:
            return
        loop = asyncio.get_running_loop()
        due = loop.time() - self._deadline
        for task, started in self._tasks.items():
            if started <= due and task not in self._overdue:
                self._overdue.add(task)
                task.cancel()
        self._sweep = loop.call_later(_sweep_interval(self._deadline), self._cancel_overdue)

    async def close(self, grace: float = 1.0) -> None:
        """Give the tasks in flight `grace` seconds, then cancel the rest."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if not self._tasks:
            return
        _done, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def _sweep_interval(deadline: float) -> float:
    return max(0.01, min(1.0, deadline / 4))
