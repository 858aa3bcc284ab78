"""An apply that cannot go ahead says why, exits 1 and prints no traceback; a --backup-dir
inside the tree is git-ignored and never rescanned."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from migrate_support import PROXY, copy_corpus, git, invoke, run_cli

from kvmigrate.migrate import ApplyError, RewriteOptions, apply_plan, build_plan

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
SECRET = "sk-secret-abcdef"


def _repo(tmp_path: Path) -> Path:
    tree = tmp_path / "repo"
    tree.mkdir()
    (tree / ".env").write_text(
        f"OPENAI_BASE_URL=https://api.openai.com/v1\nOPENAI_API_KEY={SECRET}\n"
    )
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "init")
    return tree


@needs_git
def test_a_backup_dir_inside_the_tree_is_ignored_by_git_and_by_the_next_scan(
    tmp_path: Path,
) -> None:
    tree = _repo(tmp_path)
    applied = invoke(".", "--proxy-url", PROXY, "--backup-dir", "backups", "--apply", cwd=tree)
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True, check=True
    ).stdout
    assert status.split() == ["M", ".env"]  # backups/ holds the secret and stays out of git
    again = invoke(".", "--proxy-url", PROXY, cwd=tree)
    assert again.exit_code == 0, again.stdout  # a second run is a no-op
    assert "Nothing to rewrite." in again.stdout


def test_a_backup_dir_that_cannot_be_made_is_a_clear_error(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv"])
    proc = run_cli(str(tree), "--proxy-url", PROXY, "--allow-dirty", "--apply",
                   "--backup-dir", "/proc/kvmigrate-bk", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "could not write the backup under /proc/kvmigrate-bk" in proc.stderr
    assert "https://api.openai.com/v1" in (tree / "dotenv/.env").read_text()  # untouched


def test_a_file_deleted_after_the_scan_is_changed_since_it_was_scanned(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv"])
    plan = build_plan(tree, RewriteOptions(PROXY))
    (tree / "dotenv/.env").unlink()
    with pytest.raises(ApplyError, match="changed since it was scanned; run again"):
        apply_plan(plan, allow_dirty=True)
