"""Long work done a slice at a time: a generator that yields between slices and returns
its result (`kvmigrate.wire.assemble.assemble_sliced`), and the two ways to drive one.

On the event loop, `run_on_loop` lets everything else that is ready run between slices, so
one long answer's reassembly delays another request by one slice, not by all of it. On a
thread, `run_through` runs it all: a long call into C (a JSON decoder) holds the GIL for as
long as it runs, but between slices Python code runs, where the interpreter hands the GIL
to the loop's thread when that one has waited its switch interval.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")
Steps = Generator[None, None, T]


def run_through(steps: Steps[T]) -> T:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result


async def run_on_loop(steps: Steps[T]) -> T:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result
        await asyncio.sleep(0)
