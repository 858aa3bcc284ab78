"""The apply/revert contract in tables: what the manifest records and how it is written, the
permissions of everything kvmigrate leaves on disk, and the exact messages a user reads.
Each row pins what a mutant of migrate/apply.py changed (docs/mutation.md)."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from migrate_support import PROXY, copy_corpus, snapshot

from kvmigrate.migrate import RevertError, RewriteOptions, apply_plan, build_plan, revert
from kvmigrate.migrate.apply import (
    MANIFEST,
    STATE_DIR,
    ApplyError,
    DirtyTree,
    backup_base,
    revert_command,
)

OPTIONS = RewriteOptions(PROXY)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def applied(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync", "dotenv"])
    (tree / "dotenv" / ".env").chmod(0o640)
    result = apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    assert result.backup_id is not None
    return tree, backup_base(tree) / result.backup_id, result.files


def test_the_manifest_records_each_file_and_is_written_privately(tmp_path: Path) -> None:
    tree, backup_dir, files = applied(tmp_path)
    assert files
    assert all(isinstance(f, str) for f in files)
    text = (backup_dir / MANIFEST).read_text()
    manifest = json.loads(text)
    # Stable, reviewable bytes: sorted keys, two-space indent, a final newline.
    assert text == json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    assert manifest["version"] == 1
    assert re.fullmatch(r"\d{8}T\d{12}Z", manifest["id"])
    assert manifest["id"] == backup_dir.name
    assert datetime.fromisoformat(manifest["created"]).tzinfo is not None
    assert [e["path"] for e in manifest["files"]] == files
    modes = {e["path"]: e["mode"] for e in manifest["files"]}
    assert modes["dotenv/.env"] == 0o640  # the permission bits only, as they were
    assert mode(tree / "dotenv" / ".env") == 0o640  # and the rewritten file keeps them
    # Everything kvmigrate leaves behind: private, and out of git.
    assert mode(backup_dir / MANIFEST) == 0o600
    assert mode(backup_dir / "files" / "dotenv" / ".env") == 0o600
    assert mode(backup_dir) == mode(backup_dir.parent) == mode(tree / STATE_DIR) == 0o700
    ignore = tree / STATE_DIR / ".gitignore"
    assert mode(ignore) == 0o644
    assert ignore.read_text().splitlines()[-1] == "*"


def test_nothing_to_change_leaves_no_backup(tmp_path: Path) -> None:
    tree = tmp_path / "empty"
    tree.mkdir()
    (tree / "notes.txt").write_text("nothing that calls OpenAI\n")
    result = apply_plan(build_plan(tree, OPTIONS), allow_dirty=True)
    assert (result.backup_id, result.files) == (None, [])
    assert not (tree / STATE_DIR).exists()


def test_revert_reports_restored_and_unchanged_files(tmp_path: Path) -> None:
    tree, backup_dir, files = applied(tmp_path)
    # A file put back by hand already: nothing to restore there.
    env = tree / "dotenv" / ".env"
    env.write_bytes((backup_dir / "files" / "dotenv" / ".env").read_bytes())
    result = revert(tree)
    assert result.backup_id == backup_dir.name
    assert result.unchanged == ["dotenv/.env"]
    assert sorted(result.restored) == sorted(f for f in files if f != "dotenv/.env")
    assert json.loads((backup_dir / MANIFEST).read_text())["status"] == "reverted"
    assert mode(env) == 0o640


def test_a_conflict_names_every_file_changed_since(tmp_path: Path) -> None:
    tree, _, files = applied(tmp_path)
    for path in files:
        (tree / path).write_text("edited by hand\n")
    with pytest.raises(RevertError) as caught:
        revert(tree)
    assert str(caught.value) == "changed since the apply, not overwritten: " + ", ".join(files)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("not json", "unreadable manifest in "),
        ('{"version": 2, "id": "x", "files": []}', "unknown manifest format in "),
        ('["version", 1]', "unknown manifest format in "),
    ],
)
def test_a_manifest_kvmigrate_cannot_read_is_refused(
    tmp_path: Path, manifest: str, message: str
) -> None:
    tree, backup_dir, _ = applied(tmp_path)
    (backup_dir / MANIFEST).write_text(manifest)
    with pytest.raises(RevertError) as caught:
        revert(tree, backup_dir.name)
    assert str(caught.value).startswith(message + str(backup_dir))


@pytest.mark.parametrize("backup_id", ["../tree", "x/y", "no-such-backup"])
def test_an_unknown_or_escaping_backup_id_is_refused(tmp_path: Path, backup_id: str) -> None:
    tree, _, _ = applied(tmp_path)
    with pytest.raises(RevertError, match="no backup "):
        revert(tree, backup_id)


@pytest.mark.parametrize(
    ("root", "backup_dir", "expected"),
    [
        ("/w/app", None, "kvmigrate rewrite /w/app --revert 20260101T000000000000Z"),
        ("/w/my app", None, "kvmigrate rewrite '/w/my app' --revert 20260101T000000000000Z"),
        (
            "/w/app",
            "/b k",
            "kvmigrate rewrite /w/app --backup-dir '/b k' --revert 20260101T000000000000Z",
        ),
    ],
)
def test_the_revert_command_a_user_pastes(root: str, backup_dir: str | None, expected: str) -> None:
    where = Path(backup_dir) if backup_dir is not None else None
    assert revert_command(Path(root), "20260101T000000000000Z", where) == expected


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (1, "f0"),
        (5, "f0, f1, f2, f3, f4"),
        (6, "f0, f1, f2, f3, f4 and 1 more"),
        (7, "f0, f1, f2, f3, f4 and 2 more"),
    ],
)
def test_a_dirty_tree_names_five_files_and_counts_the_rest(count: int, shown: str) -> None:
    paths = [f"f{i}" for i in range(count)]
    error = DirtyTree(paths)
    assert str(error) == (
        f"the git tree has uncommitted changes ({shown}); commit or stash them, "
        "or pass --allow-dirty"
    )
    assert error.paths == paths


def test_a_file_deleted_since_the_apply_is_restored(tmp_path: Path) -> None:
    tree, backup_dir, _ = applied(tmp_path)
    original = (backup_dir / "files" / "dotenv" / ".env").read_bytes()
    (tree / "dotenv" / ".env").unlink()
    result = revert(tree)
    assert "dotenv/.env" in result.restored
    assert (tree / "dotenv" / ".env").read_bytes() == original


def test_a_revert_removes_the_copies_it_restored(tmp_path: Path) -> None:
    """The backup held `.env` as it was, live key and all: once restored, no second copy
    stays behind. The sealed manifest stays, so reverting it again is refused by name."""
    tree, backup_dir, _ = applied(tmp_path)
    original = (backup_dir / "files" / "dotenv" / ".env").read_bytes()
    result = revert(tree)
    assert (tree / "dotenv" / ".env").read_bytes() == original
    assert sorted(p.name for p in backup_dir.iterdir()) == [MANIFEST]
    assert json.loads((backup_dir / MANIFEST).read_text())["status"] == "reverted"
    with pytest.raises(RevertError) as refused:
        revert(tree, result.backup_id)
    assert str(refused.value) == (
        f"backup {result.backup_id!r} was reverted already, and its copies removed then"
    )


def test_a_backup_dir_whose_parents_do_not_exist_yet(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["dotenv"])
    shared = tmp_path / "shared" / "kvmigrate" / "backups"
    result = apply_plan(build_plan(tree, OPTIONS), allow_dirty=True, backup_dir=shared)
    assert result.backup_id is not None
    assert (shared / result.backup_id / MANIFEST).is_file()
    assert mode(shared) == 0o700
    assert revert(tree, backup_dir=shared).backup_id == result.backup_id


def test_a_manifest_edited_after_the_apply_is_no_longer_ours(tmp_path: Path) -> None:
    """Its seal covers every field: a manifest whose root (or anything) was changed is
    somebody else's, by id or as the latest."""
    tree, backup_dir, _ = applied(tmp_path)
    manifest = json.loads((backup_dir / MANIFEST).read_text())
    del manifest["root"]
    (backup_dir / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RevertError) as caught:
        revert(tree, backup_dir.name)
    assert str(caught.value) == (
        f"backup {backup_dir.name!r} under {backup_dir.parent} was not written by `kvmigrate "
        "rewrite --apply` as this user (it may have come with the repository): refused, "
        "nothing was written"
    )
    with pytest.raises(RevertError, match=r"^no backup left to revert under "):
        revert(tree)


def failing_replace(after: int, once: bool = False) -> Callable[[Path, Path], None]:
    """`os.replace` that fails at its (after+1)-th call (and on, unless `once`), as a full
    disk would."""
    calls = []

    def replace(src: Path, dst: Path) -> None:
        calls.append(dst)
        if len(calls) == after + 1 or (len(calls) > after and not once):
            raise OSError(28, "No space left on device")
        os.replace(src, dst)

    return replace


def test_a_failed_apply_restores_from_its_backup_in_a_shared_dir(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync", "dotenv"])
    original = snapshot(tree)
    shared = tmp_path / "shared"
    plan = build_plan(tree, OPTIONS)
    assert len(plan.changes) >= 2
    with pytest.raises(ApplyError) as caught:
        apply_plan(plan, allow_dirty=True, replace=failing_replace(1, once=True), backup_dir=shared)
    [backup_id] = [p.name for p in shared.iterdir()]
    assert str(caught.value) == (
        "apply stopped after 1 file(s): [Errno 28] No space left on device; "
        f"every file was restored from backup {backup_id}"
    )
    assert snapshot(tree) == original


def test_when_the_restore_fails_too_the_message_holds_the_command(tmp_path: Path) -> None:
    tree = copy_corpus(tmp_path / "tree", cases=["openai-sync", "dotenv"])
    shared = tmp_path / "shared"
    plan = build_plan(tree, OPTIONS)
    with pytest.raises(ApplyError) as caught:
        apply_plan(plan, allow_dirty=True, replace=failing_replace(1), backup_dir=shared)
    message = str(caught.value)
    [backup_id] = [p.name for p in shared.iterdir()]
    # The restore used the same failing replace: the user is told how to finish it.
    assert message.startswith("apply stopped after 1 file(s): [Errno 28] No space left on device; automatic restore failed too (")  # fmt: skip
    assert message.endswith(f"): run {revert_command(tree.resolve(), backup_id, shared)}")
