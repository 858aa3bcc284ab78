"""Where the recorder's spools live, and who may read which: a directory per proxy process.

    <root>/<pid>-<token>/owner.lock   held (flock) by the proxy process while it lives
                        /meta.json    its records' `source`
                        /lane<N>/     one lane's segments and ack (recorder.spool)
                        /lane<N>/lock held by the lane's worker process while it reads
                        /stopped      written by a clean stop that left records behind

A lock dies with its holder, whatever kills it, and a pid may be reused: so liveness is
the lock, never the pid. A directory whose owner lock can be taken belongs to a process
that is gone, and the next recorder to start replays it (kvmigrate.recorder.replay).

The spool holds each exchange as the proxy saw it, before redaction: directories 0700,
files 0600, and each segment removed once its records are written.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from kvmigrate.config import safe_url
from kvmigrate.recorder.spool import FILE_MODE
from kvmigrate.recorder.sqlite_store import sqlite_path

DIR_MODE = 0o700
OWNER_LOCK = "owner.lock"
LANE_LOCK = "lock"
META = "meta.json"
STOPPED = "stopped"
_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class SpoolSettings:
    """`root`: the directory of every proxy process's spool; `max_bytes`: what one
    process's spool may hold before new records are dropped (and counted, `spool_full`);
    `sync`: fdatasync each group of appended frames (record.durability: fsync)."""

    root: Path
    max_bytes: int = 256 << 20
    sync: bool = False


def spool_root(url: str, configured: str = "") -> Path | None:
    """`configured`, or beside a SQLite records file (`records.db` -> `records.db.spool`),
    or for PostgreSQL `.kvmigrate/spool-<digest of the URL>`. None for an in-memory
    database, whose records do not outlive the process anyway."""
    if configured:
        return Path(configured).absolute()
    if url.startswith("sqlite:"):
        path = sqlite_path(url)
        if path == ":memory:":
            return None
        file = Path(path).absolute()
        return file.with_name(file.name + ".spool")
    digest = hashlib.sha256(safe_url(url).encode()).hexdigest()[:12]
    return Path(".kvmigrate", f"spool-{digest}").absolute()


def hold(path: Path, wait_s: float | None = 0.0) -> int | None:
    """An exclusive flock on `path` (created 0600): its descriptor, to close to let go; or
    None when another process still holds it after `wait_s` (None: wait as long as it
    takes)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(_POLL_S)


class ProcessSpool:
    """This process's spool directory, locked for as long as the process lives."""

    def __init__(self, root: Path, source: str, db: str) -> None:
        self.root = root
        name = f"{os.getpid()}-{secrets.token_hex(4)}"
        # Made under a hidden name and renamed once locked: a replay never sees it unlocked.
        making = root / f".{name}"
        for attempt in range(3):
            root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
            try:
                making.mkdir(mode=DIR_MODE)
                break
            except FileNotFoundError:  # the root, empty, removed by a process that stopped
                if attempt == 2:
                    raise
        self._owner = hold(making / OWNER_LOCK)
        meta = {"source": source, "db": safe_url(db), "started": time.time()}
        (making / META).write_bytes(orjson.dumps(meta))
        os.chmod(making / META, FILE_MODE)
        self.path = root / name
        making.rename(self.path)

    def lane(self, index: int) -> Path:
        path = self.path / f"lane{index}"
        path.mkdir(mode=DIR_MODE, exist_ok=True)
        return path

    def release(self, written: bool) -> None:
        """Let go: remove the directory when every record in it is `written`, else leave
        it, marked as stopped cleanly, to the next start."""
        if self._owner is None:
            return
        if written:
            shutil.rmtree(self.path, ignore_errors=True)
            with contextlib.suppress(OSError):  # not empty: another process's spool is there
                self.root.rmdir()
        else:
            with contextlib.suppress(OSError):
                (self.path / STOPPED).touch(mode=FILE_MODE)
        os.close(self._owner)
        self._owner = None


def others_in(root: Path, own: Path) -> bool:
    """Whether `root` holds spools other than `own` (some perhaps of processes gone)."""
    try:
        return any(entry != own for entry in root.iterdir())
    except FileNotFoundError:
        return False


def orphaned_spools(root: Path, own: Path | None = None) -> Iterator[tuple[Path, int]]:
    """Each spool directory under `root` whose process is gone, with its owner lock now
    held for the caller (a descriptor to close); one that another replay holds is skipped."""
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        if entry == own or not entry.is_dir():
            continue
        if entry.name.startswith("."):
            _remove_unfinished(entry)
            continue
        try:
            fd = hold(entry / OWNER_LOCK)
        except FileNotFoundError:  # removed since it was listed
            continue
        if fd is not None:
            yield entry, fd


def _remove_unfinished(entry: Path) -> None:
    """A directory a process died making (it never held a record): removed once it is old
    enough that its maker, had it lived, would long since have locked it."""
    with contextlib.suppress(OSError):
        if time.time() - entry.stat().st_mtime < 60:
            return
        fd = hold(entry / OWNER_LOCK)
        if fd is not None:
            shutil.rmtree(entry, ignore_errors=True)
            os.close(fd)


def lanes(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("lane*") if p.is_dir())


def spool_meta(directory: Path) -> tuple[str, str]:
    """The `source` the process that spooled here gave its records, and its records
    database (as `safe_url` writes it); "" for what cannot be read."""
    meta: dict[str, object] = {}
    with contextlib.suppress(OSError, ValueError):
        meta = orjson.loads((directory / META).read_bytes())
    source, db = meta.get("source"), meta.get("db")
    return (source if isinstance(source, str) else ""), (db if isinstance(db, str) else "")


def last_touched(directory: Path) -> float:
    """When anything in the directory last changed: about when its process stopped."""
    times = [p.stat().st_mtime for p in directory.rglob("*") if p.is_file()]
    return max(times, default=directory.stat().st_mtime)
