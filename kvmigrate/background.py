"""The proxy's worker processes (the recorder's, the cache-buster detector's): started,
stepped out of the response path's way, and started again when they die."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from typing import Any

from kvmigrate.lazy import load

# The lowest priority: on Linux the SCHED_IDLE policy (any ordinary task that wakes up
# preempts it at once), elsewhere nice 19. When a worker shares a core with a busy proxy (a
# pinned proxy, a pod's CPU limit), it no longer takes the quarter of that core that nice +5
# got, and the proxy runs about as fast as without workers (benchmarks/proxy_overhead.py,
# benchmarks/recorder_loop_lag.py; the figures are in docs/performance-history.md). The
# cost: a saturated core leaves the workers behind, and their bounded queues drop, and
# count, what does not fit. With a core to spare they run at full speed.
BACKGROUND_NICE = 19
# A worker that must not starve (the recorder's, kvmigrate.pacer) keeps one thread at this
# nice value, taken before its work steps down to the lowest priority: a thread cannot
# leave SCHED_IDLE, nor lower its nice value, without CAP_SYS_NICE, so the raised thread
# has to exist from the start. Against a busy core's ordinary (nice 0) task it gets about a
# tenth of the core.
RAISED_NICE = 10


def become_background_worker(raisable: bool = False) -> None:
    """Lowest CPU priority, and deaf to SIGINT: a Ctrl-C reaches the whole process group,
    and the proxy decides when its workers stop (after writing what they hold).
    `raisable`: this thread stays at RAISED_NICE, where it was started; the worker steps
    down thread by thread (kvmigrate.pacer)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not raisable:
        lowest_priority()


def lowest_priority() -> None:
    """For the calling thread (Linux keeps both per thread), and what it starts."""
    with contextlib.suppress(OSError):
        os.nice(BACKGROUND_NICE - os.nice(0))
    with contextlib.suppress(OSError, AttributeError):  # SCHED_IDLE is Linux's
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def start_at_lowest_priority(process: SpawnProcess, raisable: bool = False) -> None:
    """Start `process` from a short-lived thread at the lowest priority, which the child
    inherits: its interpreter start-up and imports, before its main can step aside, then
    no longer take the proxy's core (about 0.1 s of CPU per worker at every start, on a
    pinned proxy's own core). `raisable`: at RAISED_NICE instead, which the child keeps
    for the thread that raises its work when it falls behind. The thread ends with the
    start, so no priority is restored. Only on Linux, where nice and the scheduling policy
    are a thread's own: elsewhere `nice` is the whole process's, the proxy's too, so the
    child lowers itself as it runs."""
    if not sys.platform.startswith("linux"):
        process.start()
        return
    failed: list[BaseException] = []

    def start() -> None:
        try:
            if raisable:
                with contextlib.suppress(OSError):
                    os.nice(max(0, RAISED_NICE - os.nice(0)))
            else:
                lowest_priority()
            process.start()
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=start, name=f"start-{process.name}")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


# The least time between two starts of a worker that keeps dying: a crash loop must not
# take the CPU the proxy needs.
RESPAWN_S = 1.0


class WorkerGone(Exception):
    """The worker died, or cannot be started yet: what was sent to it is lost."""


class WorkerProcess:
    """One worker process of the proxy's, and the proxy's end of its pipe: started with
    `spawn`, never `fork` (the proxy has threads and an event loop, and forking those is
    undefined), at the lowest priority, and started again after it dies, at most once per
    `RESPAWN_S`. `background=False` keeps the child at normal priority (a serving worker);
    `raisable=True` starts a background one at RAISED_NICE, for kvmigrate.pacer to step
    its work down and up.

    The child runs `target(conn, *args())`, `target` named as `"module:function"` and
    imported in the child only; `args` is read at each start."""

    def __init__(
        self,
        name: str,
        target: str,
        args: Callable[[], tuple[Any, ...]],
        *,
        duplex: bool = False,
        pipe_bytes: int = 0,
        on_start: Callable[[], None] | None = None,
        background: bool = True,
        raisable: bool = False,
    ) -> None:
        self.name = name
        self._background = background
        self._raisable = raisable
        self._target = target
        self._args = args
        self._duplex = duplex
        self._pipe_bytes = pipe_bytes
        self._on_start = on_start
        self._context = multiprocessing.get_context("spawn")
        self._process: SpawnProcess | None = None
        self._conn: Connection | None = None
        self._last_start = 0.0
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._conn is not None and self._process is not None and self._process.is_alive()

    def start(self) -> None:
        if self._on_start is not None:
            self._on_start()
        self._last_start = time.monotonic()
        if self._duplex:
            ours, theirs = self._context.Pipe(duplex=True)
        else:
            theirs, ours = self._context.Pipe(duplex=False)
        if self._pipe_bytes:
            _widen(ours, self._pipe_bytes)
        self._process = self._context.Process(
            target=_worker_main,
            args=(self._target, self._background, self._raisable, theirs, *self._args()),
            name=self.name,
            # A proxy that exits without stopping a background worker must not wait for it; a
            # serving worker has workers of its own, which a daemon process may not have.
            daemon=self._background,
        )
        if self._background:
            start_at_lowest_priority(self._process, self._raisable)
        else:
            self._process.start()
        theirs.close()  # the child holds its own end; ours would hide its EOF
        self._conn = ours

    def restart(self) -> bool:
        """Start a worker in place of one that is gone; False if the last one started less
        than `RESPAWN_S` ago. Raises WorkerGone if a process cannot be started."""
        self._discard()
        if time.monotonic() - self._last_start < RESPAWN_S:
            return False
        self.restarts += 1
        try:
            self.start()
        except Exception as exc:  # out of processes or memory: try again later
            self._discard()
            raise WorkerGone(f"cannot start the {self.name} worker ({exc})") from exc
        return True

    def send(self, message: Any) -> None:
        """Into the pipe; raises WorkerGone if the worker is not running or the pipe broke."""
        if self._conn is None or not self.running:
            raise WorkerGone(f"the {self.name} worker is not running")
        try:
            self._conn.send(message)
        except (OSError, ValueError) as exc:
            self._discard()
            raise WorkerGone(f"the {self.name} worker is gone ({exc})") from exc

    def receive(self) -> Any:
        """The worker's next answer (duplex pipes); raises WorkerGone if it died first."""
        if self._conn is None:
            raise WorkerGone(f"the {self.name} worker is not running")
        try:
            return self._conn.recv()
        except (OSError, EOFError, ValueError) as exc:
            self._discard()
            raise WorkerGone(f"the {self.name} worker is gone ({exc})") from exc

    def poll(self, timeout: float) -> bool:
        """Whether an answer (duplex pipes) or the pipe's end is there to read."""
        if self._conn is None:
            return False
        try:
            return self._conn.poll(timeout)
        except (OSError, EOFError, ValueError):
            return True

    def terminate(self) -> None:
        """SIGTERM to the worker, if it runs (never to a pid reused after it ended)."""
        if self._process is not None and self._process.is_alive():
            self._process.terminate()

    def finish(self) -> None:
        """Tell the worker to end (a None message), if it runs."""
        with contextlib.suppress(WorkerGone):
            self.send(None)

    def join(self, timeout: float) -> bool:
        """Wait for the worker to end; False if it still runs after `timeout` seconds."""
        if self._process is not None:
            self._process.join(max(0.0, timeout))
            if self._process.is_alive():
                return False
        if self._conn is not None:
            self._conn.close()
        return True

    def close(self, timeout: float) -> None:
        """Tell the worker to end, wait up to `timeout` seconds, then kill it."""
        self.finish()
        self.join(timeout)
        self._discard()

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        self._process = None


def _worker_main(
    target: str, background: bool, raisable: bool, conn: Connection, *args: Any
) -> None:
    """The child's main: out of the response path's way first, then the worker's own."""
    if background:
        become_background_worker(raisable)
    load(target)(conn, *args)


def _widen(conn: Connection, size: int) -> None:
    """A larger pipe than Linux's 64 KiB: each time the pipe fills, both processes pay a
    read, a write and a context switch."""
    with contextlib.suppress(ImportError, AttributeError, OSError):  # not Linux, or a limit
        import fcntl

        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, size)
