"""Files and folders the scan may not read are errors (exit 1), and the rest is still scanned."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from migrate_support import PROXY

from kvmigrate.migrate import RewriteOptions, Severity, build_plan
from kvmigrate.migrate.plan import Plan

NOBODY = 65534
GOOD = "OPENAI_BASE_URL=https://api.openai.com/v1\n"


@contextmanager
def as_another_user() -> Iterator[None]:
    """Permissions do not bind root: as root, drop the effective uid for the scan."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def world_tree() -> Iterator[Path]:
    """A tree that another user may reach (pytest's tmp_path is private to its owner)."""
    top = Path(tempfile.mkdtemp(prefix="kvmigrate-unreadable-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        for dirpath, dirnames, _ in os.walk(top):
            for d in dirnames:
                Path(dirpath, d).chmod(0o755)
        for path in sorted(top.rglob("*"), reverse=True):
            path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
        top.rmdir()


def _scan(root: Path) -> Plan:
    with as_another_user():
        return build_plan(root, RewriteOptions(PROXY))


def test_a_directory_that_cannot_be_entered_is_an_error_not_a_crash(world_tree: Path) -> None:
    (world_tree / ".env").write_text(GOOD)
    (world_tree / "pgdata").mkdir(mode=0o700)
    (world_tree / "pgdata" / ".env").write_text(GOOD)
    if os.geteuid() != 0:
        (world_tree / "pgdata").chmod(0o000)
    plan = _scan(world_tree)
    assert [c.path for c in plan.changes] == [".env"]
    assert [(p.path, p.severity, p.reason) for p in plan.errors] == [
        ("pgdata/", Severity.ERROR, "unreadable")
    ]


def test_unreadable_files_and_unlistable_folders_are_errors(world_tree: Path) -> None:
    (world_tree / ".env").write_text(GOOD)
    (world_tree / "noread.py").write_text("x = 1\n")
    (world_tree / "noread.py").chmod(0o000)
    (world_tree / "private").mkdir()
    (world_tree / "private" / ".env").write_text(GOOD)
    (world_tree / "private").chmod(0o711)  # may be entered, not listed
    if os.geteuid() != 0:
        (world_tree / "private").chmod(0o311)
    plan = _scan(world_tree)
    assert [c.path for c in plan.changes] == [".env"]
    errors = {p.path: p.reason for p in plan.errors}
    assert errors == {"noread.py": "unreadable", "private/": "unreadable"}
