"""The cache-buster detector's worker process: its parsing off the proxy's GIL.

Checking a turn parses the request, reassembles the answer, renders and hashes the
conversation: more Python per request than forwarding it. On a thread of the proxy that
work held the GIL the event loop needs, and under concurrent streams every request's first
chunk waited for it (docs/performance-history.md). In a process of its own it runs on
another core, and the proxy keeps a queue, a feeder thread that waits on a pipe
with the GIL released, and its metrics.

The child is started with `spawn` (the proxy has threads and an event loop: forking those
is undefined), runs at the lowest priority and ignores SIGINT (kvmigrate.background), and
exits when its pipe says so or closes. It holds the fingerprints; a child that dies is started
again, at most once a second, and starts with none (the next turn of each conversation is
then a first turn).
"""

from __future__ import annotations

import traceback
from multiprocessing.connection import Connection
from typing import NamedTuple

from kvmigrate.background import WorkerGone, WorkerProcess
from kvmigrate.cachecheck.checker import CacheChecker, CacheCheckResult, CheckItem, StoreLimits
from kvmigrate.cachecheck.compare import Tokenize

__all__ = ["CheckerProcess", "Failed", "Outcome", "WorkerGone", "check_one", "serve"]


class Failed(NamedTuple):
    """An item the checker raised on, with the traceback for the proxy's log."""

    message: str


Outcome = CacheCheckResult | Failed | None


class CheckerProcess(WorkerProcess):
    """A `CacheChecker` in a child process. `check` is one round trip: the caller's thread
    waits on the pipe, the GIL released, while the child works."""

    def __init__(self, limits: StoreLimits, tokenize: Tokenize | None = None) -> None:
        # `tokenize` must pickle: a module-level function, or None. The limits cross as plain
        # values: unpickling StoreLimits would import the checker before the child can ask
        # to die with the proxy (kvmigrate.background).
        state = (limits.max_conversations, limits.max_bytes, limits.ttl_s)
        super().__init__(
            "kvmigrate-cachecheck",
            "kvmigrate.cachecheck.process:serve",
            lambda: (state, tokenize),
            duplex=True,
        )

    def check(self, items: list[CheckItem]) -> tuple[list[Outcome], int]:
        """The outcome of each item, in order, and how many conversations are tracked."""
        if not self.running and not self.restart():
            raise WorkerGone("the cache-check worker died less than a second ago")
        self.send(items)
        outcomes, tracked = self.receive()
        return outcomes, tracked


def serve(conn: Connection, limits: tuple[int, int, float], tokenize: Tokenize | None) -> None:
    """The child's main: check each batch it is sent and answer with the outcomes."""
    checker = CacheChecker(StoreLimits(*limits), tokenize)
    while True:
        try:
            items = conn.recv()
        except (EOFError, OSError):
            return  # the proxy is gone
        if items is None:
            return
        outcomes = [check_one(checker, item) for item in items]
        try:
            conn.send((outcomes, len(checker.store)))
        except OSError:
            return  # the proxy died while we checked (kill -9): nobody to answer


def check_one(checker: CacheChecker, item: CheckItem) -> Outcome:
    try:
        return checker.check(item)
    except Exception:
        # One odd request must not stop the checking of all the others.
        return Failed(traceback.format_exc(limit=8))
