"""Write a plan to disk so that no file is ever lost, and put every file back on request.

Order matters: every backup and the manifest are written and fsynced before the first
target changes, so a run killed at any instant leaves either the original file or the new
one (each write is a temp file + fsync + rename) plus a backup that `revert` can restore.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvmigrate.migrate.confine import OutsideTree, inside
from kvmigrate.migrate.gitstate import dirty_paths
from kvmigrate.migrate.ownership import NoSealKey, is_sealed, private_to_me, seal, seal_key
from kvmigrate.migrate.plan import FileChange, Plan
from kvmigrate.migrate.walk import BACKUP_GITIGNORE

STATE_DIR = ".kvmigrate"
BACKUP_DIR = f"{STATE_DIR}/backups"
MANIFEST = "manifest.json"
# Backups hold the files as they were, `.env` secrets included: one `git add -A` must not
# commit them, so our folder ignores itself, and only the owner may enter it.
GITIGNORE = BACKUP_GITIGNORE  # also how a later scan recognises a backup folder
DIR_MODE = 0o700
# Injected seam: os.replace in production; tests pass one that fails or dies mid-apply.
Replace = Callable[[Path, Path], None]


class ApplyError(Exception):
    """The plan could not be applied; the message says what state the tree is in."""


class DirtyTree(ApplyError):
    def __init__(self, paths: list[str]) -> None:
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        super().__init__(f"the git tree has uncommitted changes ({shown}); commit or stash "
                         "them, or pass --allow-dirty")  # fmt: skip
        self.paths = paths


class RevertError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class ApplyResult:
    backup_id: str | None
    files: list[str]


@dataclass(frozen=True, slots=True)
class RevertResult:
    backup_id: str
    restored: list[str]
    unchanged: list[str] = field(default_factory=list)  # never written (an interrupted apply)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def backup_base(root: Path, backup_dir: Path | None = None) -> Path:
    """Where a tree's backups live: `backup_dir` when given (outside the tree), else
    `<root>/.kvmigrate/backups`."""
    return backup_dir if backup_dir is not None else root / BACKUP_DIR


def apply_plan(
    plan: Plan,
    *,
    allow_dirty: bool = False,
    replace: Replace = os.replace,
    backup_dir: Path | None = None,
) -> ApplyResult:
    if not plan.changes:
        return ApplyResult(None, [])
    if not allow_dirty and (dirty := dirty_paths(plan.root)):
        raise DirtyTree(dirty)
    for change in plan.changes:
        try:
            inside(plan.root, change.path)
        except OutsideTree as exc:
            raise ApplyError(f"{exc}; nothing was rewritten") from None
        try:
            current: bytes | None = _read(plan.root / change.path)
        except OSError:  # deleted (or made unreadable) since the scan
            current = None
        if current != change.old:
            raise ApplyError(f"{change.path} changed since it was scanned; run again")
    try:
        key = seal_key(create=True)
        if backup_dir is None:
            # A repository can commit `.kvmigrate/backups` (or its .gitignore) as a symlink:
            # the user's files as they were, secrets included, would go where it points.
            for rel in (BACKUP_DIR, f"{STATE_DIR}/.gitignore"):
                inside(plan.root, rel)
    except NoSealKey as exc:
        raise ApplyError(f"{exc}; nothing was rewritten") from None
    except OutsideTree as exc:
        raise ApplyError(f"{exc} (a symlink that may have come with the repository): remove "
                         "it, or pass --backup-dir; nothing was rewritten") from None  # fmt: skip
    assert key is not None
    try:
        backup_id, where = _new_backup_dir(plan.root, backup_dir)
        manifest = _write_backups(plan, backup_id, where, key)
    except OSError as exc:
        base = backup_base(plan.root, backup_dir)
        raise ApplyError(f"could not write the backup under {base} ({exc}); nothing was "
                         "rewritten: pass a writable --backup-dir") from exc  # fmt: skip
    written: list[str] = []
    try:
        for change, entry in zip(plan.changes, manifest["files"], strict=True):
            atomic_write(plan.root / change.path, change.new, entry["mode"], backup_id, replace)
            written.append(change.path)
    except OSError as exc:
        raise ApplyError(
            _rollback(plan.root, backup_id, written, exc, replace, backup_dir)
        ) from exc
    manifest["status"] = "applied"
    _write_manifest(where, manifest, key)
    return ApplyResult(backup_id, written)


def _rollback(
    root: Path,
    backup_id: str,
    written: list[str],
    exc: OSError,
    replace: Replace,
    backup_dir: Path | None,
) -> str:
    what = f"apply stopped after {len(written)} file(s): {exc}"
    try:
        revert(root, backup_id, replace=replace, backup_dir=backup_dir)
    except (OSError, RevertError) as again:
        restore = revert_command(root, backup_id, backup_dir)
        return f"{what}; automatic restore failed too ({again}): run {restore}"
    return f"{what}; every file was restored from backup {backup_id}"


def revert_command(root: Path, backup_id: str, backup_dir: Path | None) -> str:
    """The command that puts this backup back, as a user pastes it."""
    where = f" --backup-dir {shlex.quote(str(backup_dir))}" if backup_dir is not None else ""
    return f"kvmigrate rewrite {shlex.quote(str(root))}{where} --revert {backup_id}"


def _new_backup_dir(root: Path, backup_dir: Path | None) -> tuple[str, Path]:
    backup_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    base = backup_base(root, backup_dir)
    if backup_dir is None:
        _private_dir(root / STATE_DIR)
        ignore = root / STATE_DIR / ".gitignore"
        if not ignore.exists():
            _write_synced(ignore, GITIGNORE.encode(), 0o644)
    _private_dir(base)
    inside = backup_dir is not None and backup_dir.resolve().is_relative_to(root.resolve())
    if inside and not (base / ".gitignore").exists():
        # A --backup-dir inside the tree must not be committed, nor rescanned (walk.py).
        _write_synced(base / ".gitignore", GITIGNORE.encode(), 0o644)
    path = base / backup_id
    path.mkdir(mode=DIR_MODE, exist_ok=False)
    os.chmod(path, DIR_MODE)  # mkdir's mode is filtered by the umask
    return backup_id, path


def _private_dir(path: Path) -> None:
    """Make path (and missing parents) and leave it 0700; an existing one is tightened."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)


def _write_backups(plan: Plan, backup_id: str, backup_dir: Path, key: bytes) -> dict[str, Any]:
    files: list[dict[str, Any]] = []
    for change in plan.changes:
        target = plan.root / change.path
        copy = backup_dir / "files" / change.path
        _private_tree(backup_dir, copy.parent)
        _write_synced(copy, change.old, 0o600)
        files.append(_entry(change, target))
    for directory in {(backup_dir / "files" / c.path).parent for c in plan.changes}:
        _fsync_dir(directory)
    manifest: dict[str, Any] = {
        "version": 1,
        "id": backup_id,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "proxy_url": plan.options.proxy_url,
        "root": str(plan.root.resolve()),
        "status": "applying",
        "files": files,
    }
    _write_manifest(backup_dir, manifest, key)
    _fsync_dir(backup_dir.parent)
    return manifest


def _private_tree(top: Path, leaf: Path) -> None:
    """Every directory from top down to leaf exists and is 0700."""
    for directory in [*reversed(leaf.relative_to(top).parents), leaf.relative_to(top)]:
        path = top / directory
        if not path.is_dir():
            path.mkdir(mode=DIR_MODE)
            os.chmod(path, DIR_MODE)


def _entry(change: FileChange, target: Path) -> dict[str, Any]:
    return {
        "path": change.path,
        "mode": target.stat().st_mode & 0o7777,
        "sha256_before": sha256(change.old),
        "sha256_after": sha256(change.new),
    }


def revert(
    root: Path,
    backup_id: str | None = None,
    *,
    replace: Replace = os.replace,
    backup_dir: Path | None = None,
) -> RevertResult:
    """Restore every file of a backup (default: this user's latest not yet reverted),
    exactly. Only a backup --apply wrote for this user is ever read (see ownership), and
    every path it names must stay inside the tree: else nothing is written."""
    root = root.resolve()
    key = seal_key(create=False)
    backup_dir = _find_backup(root, backup_id, backup_dir, key)
    manifest = _read_manifest(backup_dir)
    todo, unchanged, conflicts = _classify(root, backup_dir, manifest)
    if conflicts:
        raise RevertError("changed since the apply, not overwritten: " + ", ".join(conflicts))
    for entry in todo:
        target = root / entry["path"]
        atomic_write(target, _read(backup_dir / "files" / entry["path"]), entry["mode"],
                     manifest["id"], replace)  # fmt: skip
        if sha256(_read(target)) != entry["sha256_before"]:
            raise RevertError(f"{entry['path']}: restored bytes do not match the backup")
    for entry in manifest["files"]:
        _remove_temp(root / entry["path"], manifest["id"])
    manifest["status"] = "reverted"
    assert key is not None  # _find_backup found a sealed manifest
    _write_manifest(backup_dir, manifest, key)
    _remove_copies(backup_dir)
    return RevertResult(manifest["id"], [e["path"] for e in todo], unchanged)


def _remove_copies(backup_dir: Path) -> None:
    """The copies a revert has put back are deleted: they hold the files as they were, a
    `.env` with its live key among them, and once restored they are the tree's own again.
    The sealed manifest stays, marked reverted, so a second revert of it is refused by name.
    Removed only after the manifest says reverted: a crash in between leaves copies of
    files already restored, never a manifest pointing at copies that are gone."""
    shutil.rmtree(backup_dir / "files", ignore_errors=True)
    _fsync_dir(backup_dir)


def _classify(
    root: Path, backup_dir: Path, manifest: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    todo: list[dict[str, Any]] = []
    unchanged: list[str] = []
    conflicts: list[str] = []
    files = manifest.get("files")
    if not isinstance(files, list) or not all(isinstance(e, dict) for e in files):
        raise RevertError(f"unknown manifest format in {backup_dir}")
    for entry in files:
        try:
            target = inside(root, entry.get("path"))
            backup = inside(backup_dir / "files", entry.get("path"))
        except OutsideTree as exc:
            raise RevertError(f"refused: {exc}; nothing was written") from None
        if not backup.is_file() or sha256(_read(backup)) != entry.get("sha256_before"):
            raise RevertError(f"backup of {entry['path']} is missing or corrupt in {backup_dir}")
        try:
            current = sha256(_read(target))
        except FileNotFoundError:
            current = None  # deleted since: restoring it loses nothing
        if current == entry["sha256_before"]:
            unchanged.append(entry["path"])
        elif current in (entry.get("sha256_after"), None):
            todo.append(entry)
        else:
            conflicts.append(entry["path"])
    return todo, unchanged, conflicts


def list_backups(root: Path, backup_dir: Path | None = None) -> list[dict[str, Any]]:
    """Manifests of this tree's backups that --apply wrote for this user, newest first. A
    shared `backup_dir` may hold other trees' backups too: only those made from `root` are
    listed. Anything else in the folder (a committed look-alike) is passed over."""
    base = backup_base(root, backup_dir)
    key = seal_key(create=False)
    if key is None or not base.is_dir():
        return []
    mine = str(root.resolve())
    found = []
    for path in base.iterdir():
        manifest = _own_manifest(path, key)
        if manifest is not None and manifest.get("root") == mine:
            found.append(manifest)
    # Each id is its apply's UTC time: sorted among our own, the newest comes first.
    return sorted(found, key=lambda m: str(m["id"]), reverse=True)


def _own_manifest(path: Path, key: bytes | None) -> dict[str, Any] | None:
    """The manifest in `path` if this user's --apply wrote it there, else None."""
    if not private_to_me(path) or not (path / MANIFEST).is_file():
        return None
    try:
        manifest = _read_manifest(path)
    except RevertError:
        return None
    if not is_sealed(manifest, key) or manifest.get("id") != path.name:
        return None
    return manifest


def _find_backup(
    root: Path, backup_id: str | None, backup_dir: Path | None, key: bytes | None
) -> Path:
    base = backup_base(root, backup_dir)
    if backup_id is not None:
        path = base / backup_id
        if os.sep in backup_id or "/" in backup_id or not (path / MANIFEST).is_file():
            raise RevertError(f"no backup {backup_id!r} under {base}")
        _read_manifest(path)  # an unreadable one says so
        manifest = _own_manifest(path, key)
        if manifest is None:
            raise RevertError(
                f"backup {backup_id!r} under {base} was not written by `kvmigrate rewrite "
                "--apply` as this user (it may have come with the repository): refused, "
                "nothing was written"
            )
        if manifest.get("status") == "reverted":
            raise RevertError(
                f"backup {backup_id!r} was reverted already, and its copies removed then"
            )
        return path
    for manifest in list_backups(root, backup_dir):
        if manifest.get("status") != "reverted":
            return base / str(manifest["id"])
    raise RevertError(f"no backup left to revert under {base}")


def _read_manifest(backup_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads(_read(backup_dir / MANIFEST))
    except (OSError, ValueError) as exc:
        raise RevertError(f"unreadable manifest in {backup_dir}: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise RevertError(f"unknown manifest format in {backup_dir}")
    return data


def _write_manifest(backup_dir: Path, manifest: dict[str, Any], key: bytes) -> None:
    manifest.update(seal(manifest, key))
    _write_json(backup_dir / MANIFEST, manifest)


# --- durable writes ---------------------------------------------------------------------------


def atomic_write(
    path: Path, data: bytes, mode: int, tag: str, replace: Replace = os.replace
) -> None:
    """Temp file in the same directory, fsync, rename over the target, fsync the directory."""
    temp = _temp_path(path, tag)
    try:
        status = os.stat(path)
    except FileNotFoundError:
        owner = None
    else:
        owner = (status.st_uid, status.st_gid)
    try:
        _write_synced(temp, data, mode, owner)
        replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _temp_path(path: Path, tag: str) -> Path:
    # Named after the backup id, so a revert after a killed run can find and remove it.
    return path.with_name(f".{path.name}.{tag}.kvmigrate-tmp")


def _remove_temp(path: Path, tag: str) -> None:
    _temp_path(path, tag).unlink(missing_ok=True)


def _write_synced(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if owner is not None and owner != (os.geteuid(), os.getegid()):
            # Run as root (a container, sudo), a rewritten file was root's from then on, and
            # its user could no longer edit it. Only root may give a file away; anyone else
            # writes their own, as before.
            with contextlib.suppress(PermissionError):
                os.fchown(fd, *owner)
        os.fchmod(fd, mode)  # the umask must not change a script's or a secret's mode
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    body = json.dumps(data, indent=2, sort_keys=True).encode() + b"\n"
    atomic_write(path, body, 0o600, "manifest")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path) -> bytes:
    return path.read_bytes()
