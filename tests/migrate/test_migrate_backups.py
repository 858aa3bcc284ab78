"""Backups hold secrets: they must not be committable, readable by others, or forced into
the tree; and the dry run's "Apply with" line must be the exact command that applies it."""

from __future__ import annotations

import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from migrate_support import PROXY, copy_corpus, git, invoke, run_cli, snapshot

from kvmigrate.migrate import RewriteOptions, apply_plan, build_plan, list_backups, revert

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
SECRET = "sk-live-0123456789abcdefghijklmnop"


def _repo(tmp_path: Path) -> Path:
    tree = copy_corpus(tmp_path / "repo", cases=["openai-sync", "dotenv"])
    (tree / "dotenv/.env").write_text(
        f"OPENAI_API_KEY={SECRET}\nOPENAI_BASE_URL=https://api.openai.com/v1\n"
    )
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "init")
    return tree


@needs_git
def test_backups_of_secrets_are_git_ignored_and_private(tmp_path: Path) -> None:
    tree = _repo(tmp_path)
    proc = invoke(str(tree), "--proxy-url", PROXY, "--apply", cwd=tmp_path)
    assert proc.exit_code == 0, proc.stdout + proc.stderr
    assert ".gitignore" in proc.stdout  # the user is told why the backups stay out of git
    git(tree, "add", "-A")
    staged = subprocess.run(
        ["git", "diff", "--cached", "--name-only"], cwd=tree, capture_output=True, text=True
    ).stdout.split()
    assert staged
    assert not [p for p in staged if p.startswith(".kvmigrate")], staged
    backup_dirs = [tree / ".kvmigrate", *(tree / ".kvmigrate").rglob("*")]
    dirs = [p for p in backup_dirs if p.is_dir()]
    assert len(dirs) >= 4  # .kvmigrate, backups, <id>, files, ...
    assert {stat.S_IMODE(p.stat().st_mode) for p in dirs} == {0o700}
    backed_up = [p for p in (tree / ".kvmigrate").rglob(".env") if SECRET in p.read_text()]
    assert backed_up
    assert stat.S_IMODE(backed_up[0].stat().st_mode) == 0o600


@needs_git
def test_backup_dir_outside_the_tree(tmp_path: Path) -> None:
    tree = _repo(tmp_path)
    original = snapshot(tree)
    elsewhere = tmp_path / "vault"
    proc = invoke(
        str(tree), "--proxy-url", PROXY, "--backup-dir", str(elsewhere), "--apply", cwd=tmp_path
    )
    assert proc.exit_code == 0, proc.stdout + proc.stderr
    assert not (tree / ".kvmigrate").exists()
    assert [p for p in elsewhere.rglob(".env") if SECRET in p.read_text()]
    assert f"--backup-dir {elsewhere}" in proc.stdout  # the undo line finds them again
    assert invoke(str(tree), "--revert", cwd=tmp_path).exit_code == 1  # not in the tree
    back = invoke(str(tree), "--backup-dir", str(elsewhere), "--revert", cwd=tmp_path)
    assert back.exit_code == 0, back.stdout + back.stderr
    assert snapshot(tree) == original


def test_a_shared_backup_dir_reverts_only_its_own_tree(tmp_path: Path) -> None:
    vault = tmp_path / "vault"
    one = copy_corpus(tmp_path / "one", cases=["dotenv"])
    two = copy_corpus(tmp_path / "two", cases=["dotenv"])
    apply_plan(build_plan(one, RewriteOptions(PROXY)), backup_dir=vault)
    apply_plan(build_plan(two, RewriteOptions(PROXY)), backup_dir=vault)
    assert len(list_backups(one, vault)) == 1
    revert(one, backup_dir=vault)
    assert list_backups(two, vault)[0]["status"] == "applied"


def test_apply_with_line_is_the_exact_command(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync", "dotenv"])
    config = tmp_path / "other.yaml"
    config.write_text(
        "backends: {hosted: {api_base: 'https://api.openai.com/v1'}, "
        "vllm: {api_base: 'http://127.0.0.1:8000/v1'}}\n"
        "models: [{model_name: m, hosted: m, vllm: m}]\n"
    )
    for options, url in (
        (["--proxy-url", "http://kvmigrate:4000/v1"], "http://kvmigrate:4000/v1"),
        (["--config", str(config)], "http://127.0.0.1:4000/v1"),
    ):
        dry = invoke(str(tree), *options, cwd=tmp_path)
        assert dry.exit_code == 2, dry.stdout + dry.stderr
        [line] = [x for x in dry.stdout.splitlines() if "Apply with: " in x]
        command = shlex.split(line.split("Apply with: ", 1)[1])
        assert command[:2] == ["kvmigrate", "rewrite"]
        assert command[-1] == "--apply"
        pasted = run_cli(*command[2:], cwd=tmp_path)  # what a user pastes
        assert pasted.returncode == 0, pasted.stdout + pasted.stderr
        assert url in (tree / "dotenv/.env").read_text()
        assert invoke(str(tree), "--revert", cwd=tmp_path).exit_code == 0


@needs_git
def test_dirty_tree_apply_refuses_before_printing_a_diff(tmp_path: Path) -> None:
    tree = _repo(tmp_path)
    (tree / "notes.txt").write_text("work in progress\n")
    proc = run_cli(str(tree), "--proxy-url", PROXY, "--apply", cwd=tmp_path)
    assert proc.returncode == 1
    assert "notes.txt" in proc.stderr
    assert "--allow-dirty" in proc.stderr
    assert proc.stdout == ""  # no diff, no "Dry run: nothing written"
