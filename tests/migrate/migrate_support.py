"""Helpers for the `kvmigrate rewrite` tests: the fixture corpus, tree snapshots, the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click.testing
from click.testing import CliRunner

CORPUS = Path(__file__).resolve().parent / "corpus"
PROXY = "http://kvmigrate:4000/v1"
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())


def copy_corpus(dst: Path, side: str = "project", cases: list[str] | None = None) -> Path:
    """Every case's `project/` (or `expected/`) side by side under dst/<case>/."""
    for case in cases or CASES:
        shutil.copytree(CORPUS / case / side, dst / case, symlinks=True)
    return dst


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root except kvmigrate's own backups, as bytes."""
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".kvmigrate", ".git")]
        for name in filenames:
            path = Path(dirpath, name)
            if not path.is_symlink():
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def temp_files(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.kvmigrate-tmp")
        if ".kvmigrate" not in p.relative_to(root).parts
    )


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ}
    full_env.pop("KVMIGRATE_CONFIG", None)
    full_env.pop("KVMIGRATE_PROXY_KEY", None)
    full_env.update(env or {})  # what the test sets itself
    return subprocess.run(
        [sys.executable, "-m", "kvmigrate", "rewrite", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=full_env,
        check=False,
    )


def invoke(*args: str, cwd: Path) -> click.testing.Result:
    """The command in-process (fast); `run_cli` is the real process, for exit codes."""
    from kvmigrate.cli import main

    old = Path.cwd()
    os.chdir(cwd)
    try:
        env = {"KVMIGRATE_CONFIG": None, "KVMIGRATE_PROXY_KEY": None}
        return CliRunner().invoke(main, ["rewrite", *args], env=env, catch_exceptions=False)
    finally:
        os.chdir(old)


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
         *args],
        cwd=root,
        check=True,
        capture_output=True,
    )  # fmt: skip
