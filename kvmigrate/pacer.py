"""A background worker's work at the lowest priority, raised while it falls behind.

At the lowest priority (SCHED_IDLE) a worker never takes CPU an ordinary task wants, and
on a machine that other work keeps busy it may get none at all: records then wait, and
wait, in its queue. `Pacer` runs the work step by step on a thread at that priority while
it keeps up, and on the worker's main thread, at RAISED_NICE (kvmigrate.background),
while the oldest item waiting is older than `RAISE_AFTER_S`, or the proxy asked it to
finish, or the proxy is gone; once caught up the idle thread takes over again. So a busy
machine delays the work by about a second, and never starves it.

Only Linux keeps a priority per thread: elsewhere the idle thread lowers the whole process,
and the work is never raised.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from kvmigrate.background import lowest_priority

RAISE_AFTER_S = 1.0  # the oldest item's wait that raises the work
CAUGHT_UP_S = 0.25  # ... and the wait under which it steps down again
WATCH_S = 0.25  # how often the main thread looks (at RAISED_NICE, on time even when busy)
IDLE_WAIT_S = 0.5  # the longest the idle thread waits for work between two turns
RAISED_WAIT_S = 0.05  # ... and the raised one, which must look at the time often


class Pacer:
    """Runs `work(raised, stop)` over and over until it returns False (done), after
    `wait(timeout)` for something to do (a wait holds no turn). `raised` False asks for a
    short step, and `stop()` says when to cut it shorter still: the raised thread takes
    over once the idle one ends its step, which at the lowest priority on a busy core may
    take a second or more. `backlog_age()`: how long
    the oldest item waiting has waited; `urgent()`: whether to work at the raised priority
    whatever the age (the proxy asked the worker to finish). `orphaned()` is called on the
    main thread once the process that started this one is gone (where the kernel does not
    end it first, kvmigrate.background); it may exit the process."""

    def __init__(
        self,
        work: Callable[[bool, Callable[[], bool]], bool],
        wait: Callable[[float], None],
        backlog_age: Callable[[], float],
        urgent: Callable[[], bool],
        orphaned: Callable[[], None],
        on_raise: Callable[[], None] = lambda: None,
    ) -> None:
        self._work = work
        self._wait = wait
        self._backlog_age = backlog_age
        self._urgent = urgent
        self._orphaned = orphaned
        self._on_raise = on_raise
        self._parent = os.getppid()
        self._turn = threading.Lock()  # held by whichever thread is stepping
        self._raised = threading.Event()  # set: the idle thread stands aside
        self._done = threading.Event()
        self.raised = 0  # how many times the work was raised

    def run(self) -> None:
        idle = threading.Thread(target=self._idle, name="kvmigrate-idle-work", daemon=True)
        idle.start()
        while not self._done.is_set():
            self._watch_parent()
            if self._behind(RAISE_AFTER_S):
                self._work_raised()
            else:
                self._done.wait(WATCH_S)
        idle.join()

    def _behind(self, age: float) -> bool:
        return self._urgent() or self._backlog_age() > age

    def _watch_parent(self) -> None:
        if os.getppid() != self._parent:
            self._parent = os.getppid()  # told once
            self._orphaned()

    def _work_raised(self) -> None:
        self.raised += 1
        self._on_raise()
        self._raised.set()
        try:
            with self._turn:
                looked = time.monotonic()
                while not self._done.is_set():
                    if not self._work(True, self._raised.is_set):
                        self._done.set()
                        return
                    self._wait(RAISED_WAIT_S)
                    if time.monotonic() - looked >= WATCH_S:
                        looked = time.monotonic()
                        self._watch_parent()
                        if not self._behind(CAUGHT_UP_S):
                            return
        finally:
            self._raised.clear()

    def _idle(self) -> None:
        lowest_priority()
        while not self._done.is_set():
            if self._raised.is_set():
                self._done.wait(WATCH_S)
                continue
            with self._turn:
                stepping = not self._raised.is_set() and not self._done.is_set()
                if stepping and not self._work(False, self._raised.is_set):
                    self._done.set()
            self._wait(IDLE_WAIT_S)
