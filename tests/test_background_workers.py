"""The proxy's worker processes step out of the response path's way: lowest priority."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from kvmigrate.background import BACKGROUND_NICE
from kvmigrate.cachecheck.addon import CacheBusterAddon
from kvmigrate.recorder import RecorderAddon


def _workers() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children()
        if "spawn_main" in " ".join(p.cmdline()) and "resource_tracker" not in " ".join(p.cmdline())
    ]


def _lowest(process: psutil.Process) -> bool:
    idle = not hasattr(os, "SCHED_IDLE") or os.sched_getscheduler(process.pid) == os.SCHED_IDLE
    return process.nice() == BACKGROUND_NICE and idle


def test_the_recorder_and_cachecheck_workers_run_at_the_lowest_priority(tmp_path: Path) -> None:
    recorder = RecorderAddon(f"sqlite:///{tmp_path}/r.db")
    checker = CacheBusterAddon(worker="process")
    recorder.start()
    checker.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            workers = _workers()
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
    assert not _workers()
