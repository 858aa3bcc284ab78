"""Background tasks on the event loop, bounded: what the proxy's shadow copies and the LiteLLM
plugin's copies run as.

Each task stays referenced until it ends (the loop keeps only weak references). At the bound
a new task is refused and counted, never queued, so a slow backend can neither grow memory
nor delay anything on the response path. Closing waits a moment for the tasks in flight and
then cancels the rest, so shutdown never hangs (as uvicorn's graceful-shutdown timeout).
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
        on_count: Callable[[int], None] | None = None,
    ) -> None:
        """`on_refused` counts a task refused at the bound; `on_count` hears the number in
        flight each time it changes."""
        self.limit = limit
        self._on_refused = on_refused
        self._on_count = on_count
        self._tasks: set[asyncio.Task[None]] = set()

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
        self._tasks.add(task)
        self._counted()
        task.add_done_callback(self._finished)
        return True

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._counted()

    def _counted(self) -> None:
        if self._on_count is not None:
            self._on_count(len(self._tasks))

    async def close(self, grace: float = 1.0) -> None:
        """Give the tasks in flight `grace` seconds, then cancel the rest."""
        if not self._tasks:
            return
        _done, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
