"""Background tasks on the event loop, bounded: what the proxy's shadow copies and the LiteLLM
plugin's copies run as.

Each task stays referenced until it ends (the loop keeps only weak references). At the bound
a new task is refused and counted, never queued, so a slow backend can neither grow memory
nor delay anything on the response path. Closing waits a moment for the tasks in flight and
then cancels the rest, so shutdown never hangs (as uvicorn's graceful-shutdown timeout).

With a `deadline`, a task still running that long after its start is cancelled and counted.
One sweep a fraction of the deadline apart does that for all of them: an `asyncio.timeout`
per task cost the proxy CPU on every shadow copy, for a bound that rarely fires
(benchmarks/proxy_overhead.py measures the shadow cost).

What `make` starts may also be a `Flight`: work already running without a task (an upstream
call whose answer ends it from the protocol's callbacks), bounded, timed and cancelled alike.
A task, its coroutine frames and its wake-ups were a third of a shadow copy's CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

Work = Coroutine[Any, Any, None]


class Flight(Protocol):
    """Work running without a task. It calls its done callback once when it ends, or once
    `cancel()` has stopped it (soon, not from inside `cancel`)."""

    def add_done_callback(self, callback: Callable[[Flight], object], /) -> None: ...

    def cancel(self) -> object: ...


Running = asyncio.Task[None] | Flight


class BoundedTasks:
    def __init__(
        self,
        limit: int,
        on_refused: Callable[[], None],
        *,
        deadline: float | None = None,
        on_overdue: Callable[[], None] = lambda: None,
        byte_limit: int | None = None,
        on_over_bytes: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_refused` counts a task refused at the bound; `on_overdue` counts a task
        cancelled at its `deadline` (seconds after its start, give or take a quarter of it,
        at most a second). With a `byte_limit`, the sizes `start` is given (what each task
        holds in memory) add up to at most that: a task that would pass it is refused and
        counted by `on_over_bytes`."""
        self.limit = limit
        self._on_refused = on_refused
        self._tasks: dict[Running, float] = {}  # each one's start
        self.byte_limit = byte_limit
        self._on_over_bytes = on_over_bytes
        self._sizes: dict[Running, int] = {}
        self.bytes = 0  # held by the tasks in flight
        self._deadline = deadline
        self._on_overdue = on_overdue
        self._overdue: set[Running] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._emptied: asyncio.Event | None = None  # while closing

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, make: Callable[[], Work | Flight | None], size: int = 0) -> bool:
        """Run what `make()` returns as a task (a flight runs already), unless a bound is
        reached (`make` is then not called) or `make` returns None. `size`: the bytes the
        task holds while it runs. Never raises, never waits."""
        if len(self._tasks) >= self.limit:
            self._on_refused()
            return False
        if self.byte_limit is not None and self.bytes + size > self.byte_limit:
            self._on_over_bytes()
            return False
        loop = asyncio.get_running_loop()
        work = make()
        if work is None:
            return False
        task = loop.create_task(work) if asyncio.iscoroutine(work) else work
        self._tasks[task] = loop.time()
        if size:
            self._sizes[task] = size
            self.bytes += size
        task.add_done_callback(self._finished)
        if self._deadline is not None and self._sweep is None:
            self._sweep = loop.call_later(_sweep_interval(self._deadline), self._cancel_overdue)
        return True

    def grow(self, task: Running, extra: int) -> bool:
        """Count `extra` more bytes held by `task`, one in flight (a copy whose body grew),
        if the byte limit allows; False, and nothing counted, otherwise."""
        if task not in self._tasks:
            return False
        if self.byte_limit is not None and self.bytes + extra > self.byte_limit:
            return False
        self._sizes[task] = self._sizes.get(task, 0) + extra
        self.bytes += extra
        return True

    def _finished(self, task: Running) -> None:
        self._tasks.pop(task, None)
        self.bytes -= self._sizes.pop(task, 0)
        if not self._tasks and self._emptied is not None:
            self._emptied.set()
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
        loop = asyncio.get_running_loop()
        until = loop.time() + grace
        tasks = {t for t in self._tasks if isinstance(t, asyncio.Task)}
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        if self._tasks:  # flights, which cannot be awaited: their last one's end sets this
            self._emptied = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), max(0.0, until - loop.time()))
        for flight in list(self._tasks):
            flight.cancel()
        await asyncio.sleep(0)  # their done callbacks


def _sweep_interval(deadline: float) -> float:
    return max(0.01, min(1.0, deadline / 4))
