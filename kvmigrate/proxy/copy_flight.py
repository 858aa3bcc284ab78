"""A copy in flight without a task: sent from the handler (`Upstream.send_now`), collected by
its answer's own callbacks, finished by one call. A task per copy, its coroutine frames and
the wake-ups of each await were a third of a shadow copy's CPU on the proxy's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvmigrate.proxy.client import ChunkSink, Response

# Called once with the answer, whole or failed; with None when the flight was cancelled.
Finish = Callable[[Response | None], None]


class CopyFlight:
    """A `kvmigrate.tasks.Flight`: bounded, timed and cancelled as a task is."""

    __slots__ = ("_done", "_ended", "_failed", "_finish", "_response")

    def __init__(
        self, response: Response, into: ChunkSink, finish: Finish, failed: Callable[[], None]
    ) -> None:
        """The answer's body parts go to `into` as they arrive. `failed` is called, inside
        an except block, when `finish` raises: a copy's failure is counted and logged, and
        never reaches the loop's exception handler."""
        self._response = response
        self._finish = finish
        self._failed = failed
        self._done: Callable[[CopyFlight], object] | None = None
        self._ended = False
        response.collect(self._collected, into)

    def add_done_callback(self, callback: Callable[[CopyFlight], object], /) -> None:
        """The one callback of whoever holds the flight (`BoundedTasks`): a second would
        silently replace it, so it is refused."""
        if self._done is not None or self._ended:
            raise RuntimeError("a copy's flight takes one done callback, before it ends")
        self._done = callback

    def cancel(self) -> bool:
        """Stop waiting: the answer is closed (its connection dropped) and the flight ends
        on the loop's next turn, unreported, as a cancelled task's copy is."""
        if self._ended:
            return False
        self._response.close()  # its collector is not called any more
        asyncio.get_running_loop().call_soon(self._end, None)
        return True

    def _collected(self) -> None:
        self._end(self._response)

    def _end(self, response: Response | None) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            self._finish(response)
        except Exception:
            self._failed()
        finally:
            self._response.close()
            done, self._done = self._done, None
            if done is not None:
                done(self)
