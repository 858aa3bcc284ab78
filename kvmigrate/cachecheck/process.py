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

import contextlib
import multiprocessing
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from typing import NamedTuple

from kvmigrate.background import become_background_worker
from kvmigrate.cachecheck.checker import CacheChecker, CacheCheckResult, CheckItem, StoreLimits
from kvmigrate.cachecheck.compare import Tokenize

_RESPAWN_S = 1.0


class Failed(NamedTuple):
    """An item the checker raised on, with the traceback for the proxy's log."""

    message: str


Outcome = CacheCheckResult | Failed | None


class WorkerGone(Exception):
    """The worker died, or cannot be started yet; the batch was not checked."""


class CheckerProcess:
    """A `CacheChecker` in a child process. `check` is one round trip: the caller's thread
    waits on the pipe, the GIL released, while the child works."""

    def __init__(self, limits: StoreLimits, tokenize: Tokenize | None = None) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._limits = limits
        self._tokenize = tokenize  # must pickle: a module-level function, or None
        self._process: SpawnProcess | None = None
        self._conn: Connection | None = None
        self._last_spawn = 0.0
        self.restarts = 0

    def start(self) -> None:
        parent, child = self._context.Pipe(duplex=True)
        self._process = self._context.Process(
            target=serve,
            args=(child, self._limits, self._tokenize),
            name="kvmigrate-cachecheck",
            daemon=True,  # a proxy that exits without closing it must not wait for it
        )
        self._last_spawn = time.monotonic()
        self._process.start()
        child.close()  # the child holds its own end; ours would hide its EOF
        self._conn = parent

    def check(self, items: list[CheckItem]) -> tuple[list[Outcome], int]:
        """The outcome of each item, in order, and how many conversations are tracked."""
        if self._conn is None or self._process is None or not self._process.is_alive():
            self._restart()
        assert self._conn is not None
        try:
            self._conn.send(items)
            outcomes, tracked = self._conn.recv()
        except (OSError, EOFError, ValueError) as exc:
            self._discard()
            raise WorkerGone(f"the cache-check worker is gone ({exc})") from exc
        return outcomes, tracked

    def _restart(self) -> None:
        self._discard()
        if time.monotonic() - self._last_spawn < _RESPAWN_S:
            raise WorkerGone("the cache-check worker died less than a second ago")
        self.restarts += 1
        try:
            self.start()
        except Exception as exc:  # out of processes or memory: try again later
            self._discard()
            raise WorkerGone(f"cannot start the cache-check worker ({exc})") from exc

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        self._process = None

    def close(self, timeout: float = 10.0) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(None)
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
            self._process = None


def serve(conn: Connection, limits: StoreLimits, tokenize: Tokenize | None) -> None:
    """The child's main: check each batch it is sent and answer with the outcomes."""
    become_background_worker()
    checker = CacheChecker(limits, tokenize)
    while True:
        try:
            items = conn.recv()
        except (EOFError, OSError):
            return  # the proxy is gone
        if items is None:
            return
        conn.send(([check_one(checker, item) for item in items], len(checker.store)))


def check_one(checker: CacheChecker, item: CheckItem) -> Outcome:
    try:
        return checker.check(item)
    except Exception:
        # One odd request must not stop the checking of all the others.
        return Failed(traceback.format_exc(limit=8))
