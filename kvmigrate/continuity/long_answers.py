"""Conversation identity's long answers: remembered by a task of their own that reassembles
the answer a slice at a time on the event loop (kvmigrate.slices), not at once in the
handler's task.

Reassembled at once, an agent's tool call of tens of thousands of deltas held the loop, and
every other request on the worker, for as long as its reassembly took. Meanwhile its next
turn still finds the conversation, by the link its request made as it arrived (the answer's
link is the one a turn that resends the answer edited needs). The tasks are bounded in
number and in the bytes they hold: past the bound an answer is not linked at all, which
costs only that, never memory or time on the response path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kvmigrate.slices import run_on_loop
from kvmigrate.tasks import BoundedTasks

MAX_TASKS = 32
MAX_BYTES = 128 * 1024 * 1024  # the answers' bodies the tasks hold, together


class _Exchange(Protocol):
    @property
    def answer_bytes(self) -> int: ...

    def answer_in_slices(self) -> Any: ...


Remember = Callable[[Any, Mapping[str, Any]], object]


class LongAnswers:
    def __init__(self, remember: Remember) -> None:
        self._remember = remember
        self._tasks = BoundedTasks(MAX_TASKS, lambda: None, byte_limit=MAX_BYTES)

    def start(self, pending: Any, exchange: _Exchange) -> None:
        """Remember `exchange`'s answer for `pending` once a task has reassembled it."""
        self._tasks.start(lambda: self.remember(pending, exchange), exchange.answer_bytes)

    async def remember(self, pending: Any, exchange: _Exchange) -> None:
        """The answer reassembled here, a slice at a time, then remembered."""
        response = await run_on_loop(exchange.answer_in_slices())
        if response is not None:
            self._remember(pending, response)

    async def close(self) -> None:
        await self._tasks.close()
