"""A revert reads only the backups `--apply` wrote for this user, and writes only inside the
tree: a repository can commit a look-alike backup (`git add -f` passes our .gitignore), and
a folder of the tree can become a symlink after the apply."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from migrate_support import PROXY, copy_corpus, git, run_cli, snapshot

from kvmigrate.migrate import RevertError, RewriteOptions, apply_plan, build_plan, revert
from kvmigrate.migrate.apply import MANIFEST, backup_base

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
FAKE_ID = "99999999T999999999999Z"  # sorts after every real backup id
PAYLOAD = b"#!/bin/sh\necho owned\n"


def _commit_a_fake_backup(origin: Path) -> None:
    """What an attacker commits: a backup whose one file lies outside the tree."""
    fake = origin / ".kvmigrate" / "backups" / FAKE_ID
    (fake / "outside").mkdir(parents=True)
    (fake / "outside" / "x.sh").write_bytes(PAYLOAD)  # files/../outside/x.sh
    (fake / "files").mkdir()
    (fake / "files" / ".keep").write_bytes(b"")  # git keeps no empty folder
    manifest = {
        "version": 1,
        "id": FAKE_ID,
        "created": "2999-01-01T00:00:00+00:00",
        "status": "applied",
        "files": [
            {
                "path": "../outside/x.sh",
                "mode": 0o755,
                "sha256_before": hashlib.sha256(PAYLOAD).hexdigest(),
                "sha256_after": hashlib.sha256(b"").hexdigest(),
            }
        ],
    }
    (fake / MANIFEST).write_text(json.dumps(manifest))
    git(origin, "add", "-f", ".kvmigrate")
    git(origin, "commit", "-q", "-m", "helpful backup")


def _cloned_repo(tmp_path: Path, umask_077: bool) -> Path:
    origin = copy_corpus(tmp_path / "origin", cases=["dotenv"])
    git(origin, "init", "-q")
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "init")
    _commit_a_fake_backup(origin)
    (tmp_path / "work" / "outside").mkdir(parents=True)  # a folder the user may write to
    clone = tmp_path / "work" / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    if umask_077:  # what a clone under `umask 077` (or an archive) gives: our modes exactly
        for path in (clone / ".kvmigrate").rglob("*"):
            path.chmod(0o700 if path.is_dir() else 0o600)
        (clone / ".kvmigrate").chmod(0o700)
    return clone


@needs_git
@pytest.mark.parametrize("umask_077", [False, True])
def test_a_committed_backup_is_never_reverted(tmp_path: Path, umask_077: bool) -> None:
    clone = _cloned_repo(tmp_path, umask_077)
    original = snapshot(clone)
    applied = run_cli(str(clone), "--proxy-url", PROXY, "--apply", cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    own_id = next(p.name for p in backup_base(clone).iterdir() if p.name != FAKE_ID)

    by_id = run_cli(str(clone), "--revert", FAKE_ID, cwd=tmp_path)
    assert by_id.returncode == 1
    assert by_id.stderr == (
        f"Error: backup {FAKE_ID!r} under {backup_base(clone.resolve())} was not written by "
        "`kvmigrate rewrite --apply` as this user (it may have come with the repository): "
        "refused, nothing was written\n"
    )
    assert not (tmp_path / "work" / "outside" / "x.sh").exists()

    latest = run_cli(str(clone), "--revert", cwd=tmp_path)
    assert latest.returncode == 0, latest.stdout + latest.stderr
    assert latest.stdout.startswith(f"Reverted backup {own_id}: ")  # the user's own
    assert snapshot(clone) == original
    assert not (tmp_path / "work" / "outside" / "x.sh").exists()


def _applied(tmp_path: Path) -> tuple[Path, str, dict[str, bytes]]:
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv"])
    result = apply_plan(build_plan(tree, RewriteOptions(PROXY)), allow_dirty=True)
    assert result.backup_id is not None
    return tree, result.backup_id, snapshot(tree)


def test_a_folder_swapped_for_a_symlink_is_not_written_through(tmp_path: Path) -> None:
    tree, _, _ = _applied(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(tree / "dotenv")
    (tree / "dotenv").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RevertError) as caught:
        revert(tree)
    assert str(caught.value) == (
        f"refused: 'dotenv/.env' leads outside {tree}; nothing was written"
    )
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("path", ["../outside/x.sh", "/tmp/x.sh", "dotenv/../../x.sh"])
def test_a_sealed_manifest_naming_a_path_outside_is_refused(tmp_path: Path, path: str) -> None:
    """Even a manifest with this user's seal: nothing it names may lead out of the tree."""
    from kvmigrate.migrate.ownership import seal, seal_key

    tree, backup_id, rewritten = _applied(tmp_path)
    where = backup_base(tree) / backup_id
    manifest = json.loads((where / MANIFEST).read_text())
    manifest["files"][0]["path"] = path
    key = seal_key(create=False)
    assert key is not None
    (where / MANIFEST).write_text(json.dumps(seal(manifest, key)))
    with pytest.raises(RevertError, match=r"^refused: .* nothing was written$"):
        revert(tree)
    assert snapshot(tree) == rewritten
    assert not (tmp_path / "outside").exists()
    assert not Path("/tmp/x.sh").exists()


def test_the_seal_key_is_private_and_outside_the_tree(tmp_path: Path) -> None:
    tree, _, _ = _applied(tmp_path)
    key = Path(os.environ["XDG_STATE_HOME"]) / "kvmigrate" / "backup-seal.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert not key.is_relative_to(tree)


@pytest.mark.parametrize(
    ("link", "named"),
    [(".kvmigrate", ".kvmigrate/backups"), (".kvmigrate/backups", ".kvmigrate/backups"),
     (".kvmigrate/.gitignore", ".kvmigrate/.gitignore")],
)  # fmt: skip
def test_backups_never_follow_a_committed_symlink_out_of_the_tree(
    tmp_path: Path, link: str, named: str
) -> None:
    """`.kvmigrate/backups` committed as a symlink would have the apply copy the user's
    files, secrets included, to wherever it points."""
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv"])
    original = snapshot(tree)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tree / link).parent.mkdir(parents=True, exist_ok=True)
    (tree / link).symlink_to(elsewhere / "target")  # dangling: a write would create it
    result = run_cli(str(tree), "--proxy-url", PROXY, "--apply", "--allow-dirty", cwd=tmp_path)
    assert result.returncode == 1
    assert f"'{named}' leads outside {tree}" in result.stderr
    assert "nothing was rewritten" in result.stderr
    assert list(elsewhere.iterdir()) == []
    assert snapshot(tree) == original
