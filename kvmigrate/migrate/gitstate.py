"""Is the tree under version control clean? Applying on a dirty tree mixes our edits with
the user's, and `git checkout` could no longer undo just ours."""

from __future__ import annotations

import subprocess
from pathlib import Path


def dirty_paths(root: Path) -> list[str]:
    """Uncommitted paths under root, ours (.kvmigrate/) excepted. Not a git tree: clean."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain=v1", "-z", "--untracked-files=all",
             "--", "."],
            capture_output=True,
            timeout=60,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []  # no git installed: nothing can be dirty in the sense we guard against
    if proc.returncode != 0:
        return []  # not inside a work tree
    entries = proc.stdout.decode("utf-8", "replace").split("\0")
    paths: list[str] = []
    skip_next = False
    for entry in entries:
        if skip_next:  # the source path of a rename
            skip_next = False
            continue
        if len(entry) < 4:
            continue
        status, path = entry[:2], entry[3:]
        skip_next = "R" in status or "C" in status
        if ".kvmigrate/" not in f"/{path}":
            paths.append(path)
    return paths
