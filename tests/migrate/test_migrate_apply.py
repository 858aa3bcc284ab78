"""Apply and revert under failure: no file is ever lost, and a dirty git tree is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from migrate_support import PROXY, copy_corpus, git, snapshot, temp_files

from kvmigrate.migrate import (
    ApplyError,
    DirtyTree,
    RevertError,
    RewriteOptions,
    apply_plan,
    build_plan,
    list_backups,
    revert,
)

OPTIONS = RewriteOptions(PROXY)


def failing_replace(succeed: int, *, once: bool) -> Callable[[Path, Path], None]:
    """An os.replace that works `succeed` times, then raises (once, or from then on)."""
    calls = {"n": 0}

    def replace(src: Path, dst: Path) -> None:
        calls["n"] += 1
        if calls["n"] == succeed + 1 or (not once and calls["n"] > succeed):
            raise OSError(28, "No space left on device (injected)")
        os.replace(src, dst)

    return replace


@pytest.mark.parametrize("succeed", [0, 7, 20])
def test_apply_that_keeps_failing_leaves_a_revertable_tree(tmp_path: Path, succeed: int) -> None:
    tree = copy_corpus(tmp_path / "tree")
    original = snapshot(tree)
    plan = build_plan(tree, OPTIONS)
    assert len(plan.changes) > 20
    with pytest.raises(ApplyError) as info:
        apply_plan(plan, allow_dirty=True, replace=failing_replace(succeed, once=False))
    assert f"after {succeed} file(s)" in str(info.value)
    if succeed == 0:  # nothing was written, so there was nothing to restore
        assert "every file was restored" in str(info.value)
        assert snapshot(tree) == original
        return
    assert "automatic restore failed too" in str(info.value)
    assert "--revert" in str(info.value)
    now = snapshot(tree)
    assert now.keys() == original.keys()  # nothing lost, even mid-apply
    new = {c.path: c.new for c in plan.changes}
    assert all(now[rel] in (data, new.get(rel)) for rel, data in original.items())
    assert temp_files(tree) == []
    [manifest] = list_backups(tree)
    assert manifest["status"] == "applying"
    revert(tree)
    assert snapshot(tree) == original


def test_apply_failure_is_rolled_back_automatically(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree")
    original = snapshot(tree)
    with pytest.raises(ApplyError, match="every file was restored"):
        apply_plan(
            build_plan(tree, OPTIONS), allow_dirty=True, replace=failing_replace(5, once=True)
        )
    assert snapshot(tree) == original
    assert list_backups(tree)[0]["status"] == "reverted"


_KILLER = """
import os, signal, sys
from pathlib import Path
from kvmigrate.migrate import RewriteOptions, apply_plan, build_plan
calls = 0
def replace(src, dst):
    global calls
    calls += 1
    if calls > int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no finally: a power cut
    os.replace(src, dst)
apply_plan(build_plan(Path(sys.argv[1]), RewriteOptions(sys.argv[3])), allow_dirty=True,
           replace=replace)
"""


@pytest.mark.parametrize("after", [1, 12])
def test_killed_apply_loses_nothing_and_reverts(tmp_path: Path, after: int) -> None:
    tree = copy_corpus(tmp_path / "tree")
    original = snapshot(tree)
    proc = subprocess.run(
        [sys.executable, "-c", _KILLER, str(tree), str(after), PROXY],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    now = snapshot(tree)
    assert {rel for rel in now if not rel.endswith(".kvmigrate-tmp")} == original.keys()
    assert len(temp_files(tree)) == 1  # the write that was cut off
    result = revert(tree)
    assert snapshot(tree) == original
    assert temp_files(tree) == []
    assert len(result.restored) == after
    assert list_backups(tree)[0]["status"] == "reverted"


def test_revert_refuses_to_overwrite_later_edits(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync", "dotenv"])
    apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    edited = tree / "dotenv/.env"
    edited.write_text("OPENAI_BASE_URL=http://edited-by-hand/v1\n")
    with pytest.raises(RevertError, match=r"dotenv/\.env"):
        revert(tree)
    assert edited.read_text() == "OPENAI_BASE_URL=http://edited-by-hand/v1\n"
    assert "kvmigrate" in (tree / "openai-sync/app/chat.py").read_text()  # nothing half-reverted


def test_revert_by_id_latest_and_none_left(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync"])
    original = snapshot(tree)
    first = apply_plan(build_plan(tree, RewriteOptions("http://first:4000/v1")), allow_dirty=True)
    middle = snapshot(tree)
    second = apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    assert first.backup_id
    assert second.backup_id
    assert first.backup_id < second.backup_id
    assert revert(tree).backup_id == second.backup_id  # latest first
    assert snapshot(tree) == middle
    assert revert(tree, first.backup_id).restored == ["openai-sync/app/chat.py"]
    assert snapshot(tree) == original
    with pytest.raises(RevertError, match="no backup left"):
        revert(tree)
    with pytest.raises(RevertError, match="no backup"):
        revert(tree, "../../etc")


def test_manifest_is_written_before_any_target(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv"])
    seen: list[dict[str, object]] = []

    def spy(src: Path, dst: Path) -> None:
        if dst.name != "manifest.json":
            [manifest] = list_backups(tree)
            seen.append(manifest)
            for entry in manifest["files"]:  # type: ignore[attr-defined]
                assert (
                    tree / ".kvmigrate/backups" / str(manifest["id"]) / "files" / entry["path"]
                ).is_file()
        os.replace(src, dst)

    apply_plan(build_plan(tree, OPTIONS), allow_dirty=True, replace=spy)
    assert len(seen) == 3
    assert seen[0]["status"] == "applying"
    manifest = json.loads(next((tree / ".kvmigrate/backups").glob("*/manifest.json")).read_text())
    assert manifest["status"] == "applied"
    assert manifest["proxy_url"] == PROXY


def test_stale_plan_is_refused(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv"])
    plan = build_plan(tree, OPTIONS)
    (tree / "dotenv/.env").write_text("OPENAI_BASE_URL=https://changed/v1\n")
    with pytest.raises(ApplyError, match="changed since it was scanned"):
        apply_plan(plan, allow_dirty=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_dirty_git_tree_is_refused_unless_allowed(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "repo", cases=["openai-sync", "dotenv"])
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "init")
    (tree / "notes.txt").write_text("work in progress\n")
    original = snapshot(tree)
    with pytest.raises(DirtyTree, match=r"notes\.txt.*--allow-dirty"):
        apply_plan(build_plan(tree, OPTIONS))
    assert snapshot(tree) == original
    assert not (tree / ".kvmigrate").exists()
    (tree / "notes.txt").unlink()
    result = apply_plan(build_plan(tree, OPTIONS))  # clean now
    assert result.files
    # Our own backups do not make the tree dirty; the rewritten files do.
    git(tree, "commit", "-q", "-am", "point at the proxy")
    assert apply_plan(build_plan(tree / "dotenv", RewriteOptions("http://other:1/v1"))).files


def test_non_git_directory_counts_as_clean(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "plain", cases=["dotenv"])
    assert apply_plan(build_plan(tree, OPTIONS)).files
