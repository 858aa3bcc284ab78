"""Bounded background tasks: refused and counted at the bound, closed without hanging."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvmigrate.tasks import BoundedTasks, Work


async def wait_to_be_cancelled(cancelled: asyncio.Event) -> None:
    """Never ends by itself; sets `cancelled` when it is cancelled."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cancelled.set()
        raise


def test_at_the_bound_a_task_is_refused_counted_and_never_made() -> None:
    async def scenario() -> None:
        refused: list[int] = []
        release = asyncio.Event()
        made: list[int] = []

        async def wait() -> None:
            await release.wait()

        def make(n: int) -> Work:
            made.append(n)
            return wait()

        tasks = BoundedTasks(2, lambda: refused.append(1))
        assert tasks.start(lambda: make(1))
        assert tasks.start(lambda: make(2))
        assert not tasks.start(lambda: make(3))
        assert (made, len(refused), len(tasks)) == ([1, 2], 1, 2)
        release.set()
        await tasks.close(grace=5)
        await asyncio.sleep(0)  # the done callbacks run on the next loop turn
        assert len(tasks) == 0
        assert tasks.start(lambda: None) is False  # nothing to run: not a refusal
        assert len(refused) == 1

    asyncio.run(scenario())


def test_close_cancels_what_outlives_the_timeout() -> None:
    async def scenario() -> None:
        cancelled = asyncio.Event()
        tasks = BoundedTasks(4, lambda: None)
        assert tasks.start(lambda: wait_to_be_cancelled(cancelled))
        await asyncio.sleep(0)
        await tasks.close(grace=0.05)
        assert cancelled.is_set()

    asyncio.run(scenario())


def test_a_task_past_its_deadline_is_cancelled_and_counted() -> None:
    """One sweep cancels what outlives the deadline; a task that ends in time is left alone,
    and one cancelled for another reason is not counted as overdue."""

    async def scenario() -> None:
        overdue: list[int] = []
        stuck_cancelled = asyncio.Event()

        async def quick() -> None:
            await asyncio.sleep(0.01)

        tasks = BoundedTasks(4, lambda: None, deadline=0.2, on_overdue=lambda: overdue.append(1))
        started = asyncio.get_running_loop().time()
        assert tasks.start(lambda: wait_to_be_cancelled(stuck_cancelled))
        assert tasks.start(quick)
        await asyncio.wait_for(stuck_cancelled.wait(), 10)
        # Never before the deadline (10 s above is a liveness bound, not a timing).
        waited = asyncio.get_running_loop().time() - started
        assert waited >= 0.2
        await asyncio.sleep(0)  # the done callback runs on the next loop turn
        assert (overdue, len(tasks)) == ([1], 0)

        assert tasks.start(lambda: wait_to_be_cancelled(stuck_cancelled))
        await tasks.close(grace=0.01)  # cancelled by the close, not by the deadline
        await asyncio.sleep(0)
        assert overdue == [1]

    asyncio.run(scenario())


class TimedFlight:
    """Work without a task, as a shadow copy collected by its answer's callbacks is: it ends
    by itself after `seconds` (None: never) or when cancelled, and says so once."""

    def __init__(self, seconds: float | None) -> None:
        self.ended: str | None = None
        self._done: list[Callable[[TimedFlight], object]] = []
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(seconds, self._end, "done") if seconds else None

    def add_done_callback(self, callback: Callable[[TimedFlight], object], /) -> None:
        self._done.append(callback)

    def cancel(self) -> bool:
        if self._timer is not None:
            self._timer.cancel()
        asyncio.get_running_loop().call_soon(self._end, "cancelled")
        return True

    def _end(self, how: str) -> None:
        if self.ended is None:
            self.ended = how
            for callback in self._done:
                callback(self)


def test_flights_count_against_the_bound_and_leave_it_when_they_end() -> None:
    async def scenario() -> None:
        refused: list[int] = []
        tasks = BoundedTasks(2, lambda: refused.append(1))
        quick, long = TimedFlight(0.05), TimedFlight(None)
        assert tasks.start(lambda: quick)
        assert tasks.start(lambda: long)
        assert not tasks.start(lambda: TimedFlight(None))
        assert (len(tasks), refused) == (2, [1])
        await asyncio.sleep(0.2)
        assert (quick.ended, len(tasks)) == ("done", 1)
        await tasks.close(grace=0.05)
        assert (long.ended, len(tasks)) == ("cancelled", 0)

    asyncio.run(scenario())


def test_a_flight_past_its_deadline_is_cancelled_and_counted() -> None:
    async def scenario() -> None:
        overdue: list[int] = []
        tasks = BoundedTasks(4, lambda: None, deadline=0.2, on_overdue=lambda: overdue.append(1))
        stuck, quick = TimedFlight(None), TimedFlight(0.01)
        assert tasks.start(lambda: stuck)
        assert tasks.start(lambda: quick)
        for _ in range(200):  # 10 s: a liveness bound, not a timing
            if stuck.ended:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0)
        assert (stuck.ended, quick.ended, overdue, len(tasks)) == ("cancelled", "done", [1], 0)

    asyncio.run(scenario())


def test_close_waits_for_flights_that_end_within_the_grace() -> None:
    async def scenario() -> None:
        tasks = BoundedTasks(4, lambda: None)
        landing = TimedFlight(0.1)
        assert tasks.start(lambda: landing)
        await tasks.close(grace=5)
        assert (landing.ended, len(tasks)) == ("done", 0)

    asyncio.run(scenario())
