"""The proxy's worker processes step out of the response path's way: lowest priority. The
recorder's work runs on a thread at the lowest priority, and its main thread waits at
RAISED_NICE to take the work over when it falls behind (kvmigrate.pacer)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import psutil
import pytest

from kvmigrate.background import BACKGROUND_NICE, RAISED_NICE, WorkerGone, WorkerProcess
from kvmigrate.cachecheck.addon import CacheBusterAddon
from kvmigrate.recorder import RecorderAddon


def _workers(before: set[int]) -> list[psutil.Process]:
    """This process's live multiprocessing children not in `before` (the pids it already had:
    an earlier test's worker still finishing, a zombie), less the resource tracker."""
    found = []
    for p in psutil.Process().children():
        if p.pid in before:
            continue
        with contextlib.suppress(psutil.Error):  # gone, or a zombie: not a running worker
            command = " ".join(p.cmdline())
            if "spawn_main" in command and "resource_tracker" not in command:
                found.append(p)
    return found


def _lowest(process: psutil.Process) -> bool:
    return _thread_lowest(process.pid)


def _thread_lowest(tid: int) -> bool:
    idle = not hasattr(os, "SCHED_IDLE") or os.sched_getscheduler(tid) == os.SCHED_IDLE
    return os.getpriority(os.PRIO_PROCESS, tid) == BACKGROUND_NICE and idle


def _raisable(process: psutil.Process) -> bool:
    """Its main thread at RAISED_NICE, and its work on a thread at the lowest priority."""
    main_nice = os.getpriority(os.PRIO_PROCESS, process.pid)
    others = [t.id for t in process.threads() if t.id != process.pid]
    return main_nice == RAISED_NICE and any(_thread_lowest(tid) for tid in others)


def test_the_recorder_and_cachecheck_workers_run_at_the_lowest_priority(tmp_path: Path) -> None:
    recorder = RecorderAddon(f"sqlite:///{tmp_path}/r.db")
    checker = CacheBusterAddon(worker="process")
    before = {p.pid for p in psutil.Process().children()}
    recorder.start()
    checker.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(psutil.Error):
                workers = _workers(before)
                # A worker steps down as it starts: wait until both have.
                one_each = sorted(_raisable(p) for p in workers) == [False, True]
                if len(workers) == 2 and one_each and any(_lowest(p) for p in workers):
                    break
            assert time.monotonic() < deadline, [(p.pid, p.nice()) for p in workers]
            time.sleep(0.05)
        if hasattr(os, "SCHED_IDLE"):
            assert os.sched_getscheduler(0) != os.SCHED_IDLE
        assert os.nice(0) < RAISED_NICE  # the proxy itself is left as it was
    finally:
        checker.close()
        recorder.close()
    # Both end once told to: at the lowest priority on a busy machine that can take a while,
    # so wait for it (generous deadline) rather than look once.
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive
    assert not _workers(before)


def wait_for_the_end(conn: Connection) -> None:
    """A worker's main (started by name, so the child imports this module): it waits until
    the pipe says stop or closes."""
    with contextlib.suppress(EOFError, OSError):
        conn.recv()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")
def test_a_worker_is_at_the_lowest_priority_from_its_start() -> None:
    """Not only once its main runs: a child at normal priority would spend its interpreter
    start-up and imports (about 0.1 s of CPU) on a pinned proxy's own core. It is read as
    soon as `start` returns, when the child is still starting its interpreter."""
    worker = WorkerProcess("test-worker", f"{__name__}:wait_for_the_end", lambda: ())
    nice, policy = os.nice(0), getattr(os, "sched_getscheduler", lambda _: None)(0)
    worker.start()
    try:
        assert worker.pid is not None
        assert _lowest(psutil.Process(worker.pid))
        # The caller's own thread, and so the proxy's, keep their priority.
        assert os.nice(0) == nice
        assert getattr(os, "sched_getscheduler", lambda _: None)(0) == policy
    finally:
        worker.close(timeout=60)
    assert not worker.running


def _receive_into(worker: WorkerProcess, raised: list[BaseException]) -> None:
    """What the feeder thread does: wait for the worker's answer, keep what it raised."""
    try:
        worker.receive()
    except BaseException as error:
        raised.append(error)


def test_a_worker_that_dies_while_its_owner_closes_it_raises_only_worker_gone() -> None:
    """At a proxy's stop, the feeder thread may find its worker's pipe broken (and discard
    the worker) while the owner's close() discards it too: each must see either the worker
    or nothing, never one half-discarded by the other (a traceback in the proxy's log)."""
    for _ in range(100):  # a narrow race: the old code lost about one round in 200
        worker = WorkerProcess(
            "test-worker", f"{__name__}:wait_for_the_end", lambda: (), duplex=True
        )
        worker.start()
        assert worker.pid is not None
        raised: list[BaseException] = []

        thread = threading.Thread(target=_receive_into, args=(worker, raised))
        thread.start()
        os.kill(worker.pid, signal.SIGKILL)
        worker.close(timeout=5)
        thread.join(30)
        assert not thread.is_alive()
        assert [type(exc) for exc in raised] == [WorkerGone], raised
        assert not worker.running
