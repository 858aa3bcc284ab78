"""The one migration runner (kvmigrate.sql_migrations): in order, once, each in the caller's
transaction with its name, on a real SQLite database."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kvmigrate.sql_migrations import Cursor, Migration, apply_migrations

FIRST = Migration("a001_t", ("CREATE TABLE t (x INTEGER)",))


def fill(cursor: Cursor) -> None:
    cursor.executemany("INSERT INTO t (x) VALUES (?)", [(1,), (2,)])


def broken(cursor: Cursor) -> None:
    cursor.execute("INSERT INTO t (x) VALUES (3)")
    raise RuntimeError("step failed")


def migrate(db: sqlite3.Connection, migrations: tuple[Migration, ...]) -> list[str]:
    db.execute("BEGIN IMMEDIATE")
    try:
        applied = apply_migrations(db.cursor(), migrations, "own_migrations")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return applied


def test_each_runs_once_in_order_and_a_failed_one_leaves_no_trace(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    assert migrate(db, (FIRST,)) == ["a001_t"]
    with pytest.raises(RuntimeError, match="step failed"):
        migrate(db, (FIRST, Migration("a002_bad", ("ALTER TABLE t ADD y TEXT",), broken)))
    # Rolled back whole: no column, no row, no name.
    assert [r[1] for r in db.execute("PRAGMA table_info(t)")] == ["x"]
    assert db.execute("SELECT name FROM own_migrations").fetchall() == [("a001_t",)]
    good = Migration("a002_fill", ("ALTER TABLE t ADD y TEXT",), fill)
    assert migrate(db, (FIRST, good)) == ["a002_fill"]
    assert migrate(db, (FIRST, good)) == []
    assert db.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
    # Its own table: another list's `migrations` table is not touched.
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"t", "own_migrations"}
    db.close()


def test_a_name_listed_twice_is_refused(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    twice = (FIRST, Migration("a001_t", ("CREATE TABLE u (x INTEGER)",)))
    with pytest.raises(ValueError, match="migration 'a001_t' is listed twice"):
        migrate(db, twice)
    db.close()
