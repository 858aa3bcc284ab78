"""The proxy's worker processes step out of the response path's way: lowest priority."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil

from kvmigrate.background import BACKGROUND_NICE
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
    idle = not hasattr(os, "SCHED_IDLE") or os.sched_getscheduler(process.pid) == os.SCHED_IDLE
    return process.nice() == BACKGROUND_NICE and idle


def test_the_recorder_and_cachecheck_workers_run_at_the_lowest_priority(tmp_path: Path) -> None:
    recorder = RecorderAddon(f"sqlite:///{tmp_path}/r.db")
    checker = CacheBusterAddon(worker="process")
    before = {p.pid for p in psutil.Process().children()}
    recorder.start()
    checker.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            workers = _workers(before)
            # A worker lowers its priority as it starts: wait until both have.
            if len(workers) == 2 and all(_lowest(p) for p in workers):
                break
            assert time.monotonic() < deadline, [(p.pid, p.nice()) for p in workers]
            time.sleep(0.05)
        if hasattr(os, "SCHED_IDLE"):
            assert os.sched_getscheduler(0) != os.SCHED_IDLE
        assert os.nice(0) < BACKGROUND_NICE  # the proxy itself is left as it was
    finally:
        checker.close()
        recorder.close()
    # Both end once told to: at the lowest priority on a busy machine that can take a while,
    # so wait for it (generous deadline) rather than look once.
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive
    assert not _workers(before)
