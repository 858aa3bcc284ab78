"""Which backups `rewrite --apply` wrote for this user: a repository can carry fake ones.

Anyone can commit a `.kvmigrate/backups/<id>/manifest.json` (`git add -f` passes our
.gitignore), and a clone or an unpacked archive gives its files the cloning user as owner
and modes from their umask (0700 folders and 0600 files under `umask 077`, whatever a tar
archive stored). Nothing inside a tree can tell such a manifest from one we wrote. So every
manifest carries a seal, an HMAC under a random key that never enters a tree: it lives in
the user's state folder (`$XDG_STATE_HOME/kvmigrate`, else `~/.local/state/kvmigrate`),
0600 in a 0700 folder, and the first --apply makes it. A manifest without a valid seal is
somebody else's, and is never reverted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

KEY_FILE = "backup-seal.key"
SEAL = "seal"
_KEY_BYTES = 32


class NoSealKey(OSError):
    """The key cannot be made or read: no backup can be written, or recognised."""


def state_home() -> Path:
    """Where kvmigrate keeps per-user state, outside any tree (the XDG base directories)."""
    configured = os.environ.get("XDG_STATE_HOME", "")
    if configured and os.path.isabs(configured):  # the spec says to ignore a relative one
        return Path(configured) / "kvmigrate"
    try:
        home = Path.home()
    except RuntimeError as exc:  # no HOME and no passwd entry (a bare container)
        raise NoSealKey(f"no home folder for the backup seal key ({exc}); set "
                        "XDG_STATE_HOME") from None  # fmt: skip
    return home / ".local" / "state" / "kvmigrate"


def seal_key(*, create: bool) -> bytes | None:
    """The user's key; None when there is none yet and `create` is false (then no backup
    can be ours)."""
    path = state_home() / KEY_FILE
    try:
        return _read_key(path)
    except FileNotFoundError:
        if not create:
            return None
    try:
        _make_key(path)
        return _read_key(path)
    except OSError as exc:
        raise NoSealKey(f"cannot write the backup seal key {path}: {exc.strerror or exc}; "
                        "set XDG_STATE_HOME to a writable folder") from None  # fmt: skip


def _make_key(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)  # mkdir's mode goes through the umask
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another run made it first: use theirs
        return
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, secrets.token_hex(_KEY_BYTES).encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        status = os.fstat(fd)
        # A key someone else owns or may rewrite could seal their manifests as ours.
        if status.st_uid != os.geteuid() or status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise NoSealKey(f"{path} is not this user's private file; remove it")
        key = os.read(fd, 4 * _KEY_BYTES).strip()
    finally:
        os.close(fd)
    if len(key) < _KEY_BYTES:
        raise NoSealKey(f"{path} is truncated; remove it (backups sealed with it are lost)")
    return key


def seal(manifest: dict[str, Any], key: bytes) -> dict[str, Any]:
    """The manifest with its seal, over every other field."""
    body = {k: v for k, v in manifest.items() if k != SEAL}
    return {**body, SEAL: _mac(body, key)}


def is_sealed(manifest: dict[str, Any], key: bytes | None) -> bool:
    given = manifest.get(SEAL)
    if key is None or not isinstance(given, str):
        return False
    body = {k: v for k, v in manifest.items() if k != SEAL}
    return hmac.compare_digest(given, _mac(body, key))


def _mac(body: dict[str, Any], key: bytes) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def private_to_me(path: Path) -> bool:
    """A folder this user owns and no one else may enter: what --apply makes for a backup."""
    try:
        status = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(status.st_mode)
        and status.st_uid == os.geteuid()
        and not status.st_mode & 0o077
    )
