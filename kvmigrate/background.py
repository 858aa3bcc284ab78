"""The proxy's worker processes (the recorder's, the cache-buster detector's): started,
stepped out of the response path's way, and started again when they die."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from typing import Any

from kvmigrate.lazy import load
from kvmigrate.vendor_internals.libc import set_parent_death_signal

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
# has to exist from the start. Against a busy core's ordinary (nice 0) task the scheduler's
# weights give it about a quarter of the core: enough to catch up with a proxy sharing it,
# where a tenth (nice 10) fell further behind.
RAISED_NICE = 5


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


class _Starter:
    """The thread that starts one worker's processes, and lives as long as they may run.

    A child takes two things from the thread that starts it. Its priority (on Linux nice
    and the scheduling policy are a thread's own): started from a thread at the lowest
    priority, or at RAISED_NICE for a raisable worker, its interpreter start-up and imports
    (a fresh interpreter's whole CPU cost: benchmarks/cpu_ab.py measures the proxy's CPU)
    no longer take a pinned proxy's own core. And its
    parent-death signal (`_die_with_parent`), which Linux sends when that *thread* ends,
    not the process: so the thread waits here until its worker has ended, and a proxy that
    is killed takes its workers with it. Elsewhere than Linux `nice` is the whole process's,
    the proxy's too, so the thread keeps its priority and the child lowers itself."""

    def __init__(self, name: str, raisable: bool) -> None:
        self._requests: queue.SimpleQueue[tuple[SpawnProcess, Future[None]] | None]
        self._requests = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, args=(raisable,), name=f"start-{name}", daemon=True
        )
        self._thread.start()

    def start(self, process: SpawnProcess) -> None:
        started: Future[None] = Future()
        self._requests.put((process, started))
        started.result()

    def stop(self) -> None:
        self._requests.put(None)

    def _run(self, raisable: bool) -> None:
        if sys.platform.startswith("linux"):
            if raisable:
                with contextlib.suppress(OSError):
                    os.nice(max(0, RAISED_NICE - os.nice(0)))
            else:
                lowest_priority()
        while (request := self._requests.get()) is not None:
            process, started = request
            try:
                process.start()
            except BaseException as exc:  # raised in the caller's thread
                started.set_exception(exc)
            else:
                started.set_result(None)


def _die_with_parent() -> None:
    """In a worker: SIGKILL when the process that started it dies (Linux's
    PR_SET_PDEATHSIG), so a proxy killed outright leaves no worker behind. A worker at the
    lowest priority on a busy machine may not get the CPU to notice for itself, nor its
    raised thread the GIL; the kernel needs neither."""
    set_parent_death_signal(signal.SIGKILL)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(0)  # it died before the signal was asked for


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
        self._starter: _Starter | None = None
        # The feeder thread discards a worker whose pipe broke while the owner's close()
        # discards it too, at shutdown: one at a time, or one finds the other's None.
        self._discarding = threading.Lock()
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        process = self._process
        return self._conn is not None and process is not None and process.is_alive()

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
            if self._starter is None:
                self._starter = _Starter(self.name, self._raisable)
            self._starter.start(self._process)
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
        conn = self._conn
        if conn is None or not self.running:
            raise WorkerGone(f"the {self.name} worker is not running")
        try:
            conn.send(message)
        except (OSError, ValueError) as exc:
            self._discard()
            raise WorkerGone(f"the {self.name} worker is gone ({exc})") from exc

    def receive(self) -> Any:
        """The worker's next answer (duplex pipes); raises WorkerGone if it died first."""
        conn = self._conn
        if conn is None:
            raise WorkerGone(f"the {self.name} worker is not running")
        try:
            return conn.recv()
        except (OSError, EOFError, ValueError) as exc:
            self._discard()
            raise WorkerGone(f"the {self.name} worker is gone ({exc})") from exc

    def poll(self, timeout: float) -> bool:
        """Whether an answer (duplex pipes) or the pipe's end is there to read."""
        conn = self._conn
        if conn is None:
            return False
        try:
            return conn.poll(timeout)
        except (OSError, EOFError, ValueError):
            return True

    def terminate(self) -> None:
        """SIGTERM to the worker, if it runs (never to a pid reused after it ended)."""
        process = self._process
        if process is not None and process.is_alive():
            process.terminate()

    def finish(self) -> None:
        """Tell the worker to end (a None message), if it runs."""
        with contextlib.suppress(WorkerGone):
            self.send(None)

    def join(self, timeout: float) -> bool:
        """Wait for the worker to end; False if it still runs after `timeout` seconds."""
        process = self._process  # the feeder may discard it meanwhile
        if process is not None:
            process.join(max(0.0, timeout))
            if process.is_alive():
                return False
        with self._discarding:  # closed once: a second close could hit a reused descriptor
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()
            self._stop_starter()
        return True

    def close(self, timeout: float) -> None:
        """Tell the worker to end, wait up to `timeout` seconds, then kill it."""
        self.finish()
        self.join(timeout)
        self._discard()

    def _discard(self) -> None:
        with self._discarding:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()
            process, self._process = self._process, None
            if process is not None and process.is_alive():
                process.kill()
                process.join(5.0)  # reaped before its starter may end
            self._stop_starter()

    def _stop_starter(self) -> None:
        starter, self._starter = self._starter, None
        if starter is not None:
            starter.stop()


def _worker_main(
    target: str, background: bool, raisable: bool, conn: Connection, *args: Any
) -> None:
    """The child's main: out of the response path's way first, then the worker's own."""
    if background:
        _die_with_parent()
        become_background_worker(raisable)
    load(target)(conn, *args)


def _widen(conn: Connection, size: int) -> None:
    """A larger pipe than Linux's 64 KiB: each time the pipe fills, both processes pay a
    read, a write and a context switch."""
    with contextlib.suppress(ImportError, AttributeError, OSError):  # not Linux, or a limit
        import fcntl

        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, size)
