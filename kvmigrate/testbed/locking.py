"""An exclusive advisory file lock, so parallel test runs do not build the same thing twice."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created if missing) for the `with` block.

    flock is released by the kernel when the process dies, so a crashed installer never
    leaves a stale lock behind (unlike a lock *file* whose existence is the lock).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
