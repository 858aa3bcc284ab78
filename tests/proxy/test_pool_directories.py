"""The metrics folders of `kvmigrate proxy --workers`: a parent killed with SIGKILL cannot
remove its own, so the next pool removes those whose parent and workers are all dead, and
nothing else. Real processes: a pid is dead because its process really exited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvmigrate.proxy.pool_metrics import new_pool_directory, remove_stale_directories


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def folder(root: Path, name: str, *files: str) -> Path:
    path = root / name
    path.mkdir()
    for file in files:
        (path / file).write_bytes(b"")
    return path


def test_only_folders_of_dead_pools_are_removed(tmp_path: Path) -> None:
    parent, worker, me = dead_pid(), dead_pid(), os.getpid()
    stale = folder(
        tmp_path,
        f"kvmigrate-metrics-{parent}-ab12",
        f"counter_{worker}.db",
        f"collected_{worker}.json",
    )
    running = folder(tmp_path, f"kvmigrate-metrics-{me}-cd34", f"counter_{worker}.db")
    # The parent is gone but a worker it started still runs (orphaned, still serving).
    orphaned = folder(tmp_path, f"kvmigrate-metrics-{parent}-ef56", f"gauge_livesum_{me}.db")
    unnamed = folder(tmp_path, "kvmigrate-metrics-gh78", f"counter_{worker}.db")  # old name
    other = folder(tmp_path, f"someone-else-{parent}-ij90")

    assert remove_stale_directories(str(tmp_path)) == [stale]
    assert not stale.exists()
    for kept in (running, orphaned, unnamed, other):
        assert kept.is_dir(), kept


def test_a_new_pool_names_its_folder_by_its_parent_and_sweeps_first(tmp_path: Path) -> None:
    stale = folder(tmp_path, f"kvmigrate-metrics-{dead_pid()}-zz00", f"counter_{dead_pid()}.db")
    created = Path(new_pool_directory(str(tmp_path)))
    assert not stale.exists()
    assert created.is_dir()
    assert created.name.startswith(f"kvmigrate-metrics-{os.getpid()}-")
    assert remove_stale_directories(str(tmp_path)) == []  # its own pool is alive
