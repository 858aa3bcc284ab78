"""A revert restores only bytes whose hash matches the manifest: a tampered or missing backup
is refused before any file is touched, and bytes that land wrong on disk are reported."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from migrate_support import PROXY, copy_corpus, snapshot

from kvmigrate.migrate import RevertError, RewriteOptions, apply_plan, build_plan, revert
from kvmigrate.migrate.apply import backup_base

OPTIONS = RewriteOptions(PROXY)


def _applied(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """A rewritten tree, its one backup directory, and the tree as the apply left it."""
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync", "dotenv"])
    result = apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    assert result.backup_id is not None
    assert result.files
    return tree, backup_base(tree) / result.backup_id, snapshot(tree)


@pytest.mark.parametrize("how", ["appended", "truncated", "deleted"])
def test_tampered_backup_is_refused_and_nothing_is_written(tmp_path: Path, how: str) -> None:
    tree, backup_dir, rewritten = _applied(tmp_path)
    copy = backup_dir / "files" / "dotenv" / ".env"
    assert copy.is_file()
    if how == "appended":
        copy.write_bytes(copy.read_bytes() + b"OPENAI_BASE_URL=http://attacker/v1\n")
    elif how == "truncated":
        copy.write_bytes(copy.read_bytes()[:-1])
    else:
        copy.unlink()
    with pytest.raises(RevertError, match=r"backup of dotenv/\.env is missing or corrupt"):
        revert(tree)
    assert snapshot(tree) == rewritten  # refused before any file was restored


def test_restored_bytes_that_do_not_match_the_backup_are_reported(tmp_path: Path) -> None:
    tree, _, _ = _applied(tmp_path)
    target = tree / "dotenv" / ".env"

    def corrupting_replace(src: Path, dst: Path) -> None:
        # What a failing disk or a concurrent writer does between the write and the check.
        if Path(dst) == target:
            Path(src).write_bytes(b"OPENAI_BASE_URL=http://not-the-backup/v1\n")
        os.replace(src, dst)

    with pytest.raises(RevertError, match=r"dotenv/\.env: restored bytes do not match"):
        revert(tree, replace=corrupting_replace)


def test_untampered_backup_reverts_exactly(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync", "dotenv"])
    original = snapshot(tree)
    apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    assert snapshot(tree) != original
    revert(tree)
    assert snapshot(tree) == original
