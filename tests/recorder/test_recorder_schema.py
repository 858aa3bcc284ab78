"""Named, append-only migrations on SQLite and PostgreSQL, safe when replicas start at once."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from kvmigrate.recorder import open_store
from kvmigrate.recorder.schema import MIGRATIONS


def test_migrations_are_recorded_by_name_and_run_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    with open_store(url, migrate=False) as store:
        assert store.migrate() == [m.name for m in MIGRATIONS]
        assert store.migrate() == []
        assert store.applied_migrations() == [m.name for m in MIGRATIONS]
    conn = sqlite3.connect(tmp_path / "r.db")
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()


def test_a_database_at_an_older_schema_gets_only_the_new_migrations(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
    )
    for statement in MIGRATIONS[0].statements:
        conn.execute(statement)
    conn.execute("INSERT INTO migrations VALUES (?, 0)", (MIGRATIONS[0].name,))
    conn.commit()
    conn.close()
    with open_store(f"sqlite:///{path}", migrate=False) as store:
        assert store.migrate() == [m.name for m in MIGRATIONS[1:]]


def test_postgres_replicas_migrating_at_once_apply_each_migration_once(pg_url: str) -> None:
    applied: list[list[str]] = []

    def open_one() -> None:
        with open_store(pg_url, migrate=False) as store:
            applied.append(store.migrate())

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(name for names in applied for name in names) == sorted(m.name for m in MIGRATIONS)
    with open_store(pg_url) as store:
        assert store.applied_migrations() == [m.name for m in MIGRATIONS]
        assert "pair_id" in store.columns("records")


def test_only_the_time_range_index_is_left_on_records(tmp_path: Path) -> None:
    """Every index is paid on each insert: only the one the report and gates read stays."""
    with open_store(f"sqlite:///{tmp_path}/r.db") as store:
        names = store.query(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'records'"
            " AND name NOT LIKE 'sqlite_autoindex%'"
        )
        assert names == [("records_ts",)]
        plan = store.query(
            "EXPLAIN QUERY PLAN SELECT * FROM records WHERE ts >= ? AND ts < ?", (0, 1)
        )
        assert "records_ts" in str(plan)


def test_a_new_sqlite_file_gets_16k_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("CREATE TABLE t (x)")  # a file made before: 4 KiB pages
    conn.close()
    for path, size in ((tmp_path / "new.db", 16384), (old, 4096)):
        with open_store(f"sqlite:///{path}") as store:
            assert store.query("PRAGMA page_size") == [(size,)]
            assert store.query("PRAGMA journal_mode") == [("wal",)]
