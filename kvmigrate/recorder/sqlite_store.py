"""Records in a SQLite file: WAL, so readers (the report, gates) never block the writer."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvmigrate.config.secret import safe_url
from kvmigrate.private_files import create_private
from kvmigrate.recorder.store import RecordStore, StoreError
from kvmigrate.sql_migrations import Cursor


def sqlite_path(url: str) -> str:
    """`sqlite:///relative/path.db`, `sqlite:////absolute/path.db` or `sqlite:///:memory:`."""
    path = url.removeprefix("sqlite://")
    if not path.startswith("/") or len(path) < 2:
        raise StoreError(
            f"expected sqlite:///relative.db or sqlite:////absolute.db, got {safe_url(url)!r}"
        )
    return path[1:]


def nothing_recorded(url: str) -> bool:
    """Whether `url` names a SQLite file that does not exist yet: a reader then has nothing
    to read, and opening it would create the database as a side effect."""
    if not url.startswith("sqlite:"):
        return False
    path = sqlite_path(url)
    return path != ":memory:" and not Path(path).exists()


class SqliteStore(RecordStore):
    dialect = "sqlite"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.path = sqlite_path(url)
        if self.path != ":memory:":
            # Whole prompts, with `content: full`: private before SQLite opens it (its -wal
            # and -shm get the database's mode).
            create_private(Path(self.path))
        # Autocommit mode with explicit BEGIN: the transaction boundaries are ours.
        self._conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=10.0
        )
        # 16 KiB pages for a new file (an existing one keeps its own): a batch commits as a
        # quarter of the WAL frames, which makes every insert cheaper.
        self._conn.execute("PRAGMA page_size=16384")
        # WAL with synchronous=NORMAL: a killed process loses nothing committed and never
        # corrupts the file (only a power loss may drop the last commits).
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=10000")

    @contextmanager
    def _transaction(self) -> Iterator[Cursor]:
        cursor = self._conn.cursor()
        # IMMEDIATE takes the write lock up front, so two writers queue instead of failing
        # half-way with SQLITE_BUSY on lock upgrade.
        cursor.execute("BEGIN IMMEDIATE")
        try:
            yield cursor
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        else:
            cursor.execute("COMMIT")
        finally:
            cursor.close()

    def _lock_schema(self, cursor: Cursor) -> None:
        """BEGIN IMMEDIATE already holds the database's write lock."""

    def sync_every_commit(self) -> None:
        """synchronous=FULL: WAL with NORMAL loses the last commits to a power cut, and a
        commit is what lets the recorder drop its spool."""
        with self._lock:
            self._conn.execute("PRAGMA synchronous=FULL")

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self.query(f"PRAGMA table_info({table})")}

    def integrity_check(self) -> str:
        return str(self.query("PRAGMA integrity_check")[0][0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()
