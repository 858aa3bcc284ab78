"""The embedded rollout store: one SQLite file, WAL, every change in one transaction.

`BEGIN IMMEDIATE` takes the write lock before reading, so two CLI calls cannot both read
version N and write N+1; a `kill -9` mid-write leaves the last committed state.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvmigrate.config.secret import safe_url
from kvmigrate.private_files import create_private
from kvmigrate.rollout.keys import StoreKeys
from kvmigrate.rollout.schema import KEY_SECRET, MIGRATIONS, MIGRATIONS_TABLE
from kvmigrate.rollout.state import CohortStates, Link, Pin, RolloutEvent, RolloutState
from kvmigrate.rollout.store import Change, StoreError, decode_event, decode_state
from kvmigrate.sql_migrations import apply_migrations

__all__ = ["KEY_SECRET", "SqliteRolloutStore", "sqlite_path"]

# What the store's migrations (kvmigrate.rollout.schema) made: a store that names them all
# is opened without the write lock.
ALL_MIGRATIONS = frozenset(m.name for m in MIGRATIONS)
# Expired links are never read (every read asks for unexpired ones); deleting them at every
# batch was a statement per batch, and `--workers` writes a batch per few answers.
LINK_SWEEP_S = 60.0
# Within SQLite's oldest default limit of 999 parameters a statement (5 a link).
LINKS_PER_INSERT = 199

# What proxies poll: the default's version plus every cohort's. A change raises exactly
# one of them (a cohort's first change from the default's version, which is larger than
# its absent 0), so the sum grows with every change.
GENERATION = (
    "SELECT COALESCE((SELECT version FROM rollout_state WHERE id = 1), 0) "
    "+ COALESCE((SELECT SUM(version) FROM rollout_cohort_state), 0)"
)


def sqlite_path(url: str) -> Path:
    """`sqlite:///relative/path.db` or `sqlite:////absolute/path.db`."""
    path = url.removeprefix("sqlite://")
    if not path.startswith("/") or len(path) < 2:
        raise StoreError(
            f"expected sqlite:///relative.db or sqlite:////absolute.db, got {safe_url(url)!r}"
        )
    return Path(path[1:])


class SqliteRolloutStore:
    def __init__(self, url: str, initial: RolloutState) -> None:
        self.url = url
        self.path = sqlite_path(url)
        self._where = f"rollout store {self.path}"
        self._initial = initial
        # One connection, used from the CLI's thread or the proxy's worker threads in turn.
        self._lock = threading.RLock()
        try:
            # It keeps the HMAC key of conversation keys: private before SQLite opens it
            # (its -wal and -shm get the database's mode).
            create_private(self.path)
            self._db = sqlite3.connect(
                self.path, timeout=10.0, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open rollout store {self.path}: {exc}") from None
        # Links have a connection of their own, opened at the first batch (see _links).
        self._links_lock = threading.Lock()
        self._links_db: sqlite3.Connection | None = None
        self._links_closed = False
        self._next_link_sweep = 0.0
        try:
            self.migrated = self.migrate()
            self.keys = self._read_keys()
        except BaseException:
            self.close()
            raise

    def migrate(self) -> list[str]:
        """Apply the migrations this store lacks, under the write lock (so two processes
        opening a new store at once apply each once); returns their names. A store that
        has them all is only read."""
        if self._applied() >= ALL_MIGRATIONS:
            return []
        with self._transaction() as db:
            return apply_migrations(db.cursor(), MIGRATIONS, MIGRATIONS_TABLE)

    def _applied(self) -> set[str]:
        table = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        if self._query_one(table, (MIGRATIONS_TABLE,)) is None:
            return set()
        return {str(row[0]) for row in self._query_all(f"SELECT name FROM {MIGRATIONS_TABLE}")}

    def _read_keys(self) -> StoreKeys:
        """The store's secret, made by the migration that hashes keys."""
        row = self._query_one("SELECT value FROM rollout_meta WHERE name = ?", (KEY_SECRET,))
        if row is None:
            raise StoreError(f"rollout store {self.path}: no key secret in rollout_meta")
        return StoreKeys(str(row[0]))

    def read(self, cohort: str = "") -> RolloutState:
        with self._lock:
            return self._current(cohort)

    def read_all(self) -> CohortStates:
        rows = self._query_all("SELECT cohort, data FROM rollout_cohort_state")
        own = {str(c): decode_state(d, self._where) for c, d in rows}
        return CohortStates(self.read(), own)

    def version(self) -> int:
        row = self._query_one(GENERATION)
        return int(row[0]) if row and row[0] else self._initial.version

    def _current(self, cohort: str) -> RolloutState:
        """The cohort's own state, else the default; under the lock (or a transaction)."""
        try:
            row = None
            if cohort:
                row = self._db.execute(
                    "SELECT data FROM rollout_cohort_state WHERE cohort = ?", (cohort,)
                ).fetchone()
            if row is None:
                row = self._db.execute("SELECT data FROM rollout_state WHERE id = 1").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"rollout store {self.path}: {exc}") from None
        return decode_state(row[0], self._where) if row else self._initial

    def apply(self, change: Change, cohort: str = "") -> tuple[RolloutState, RolloutEvent]:
        with self._transaction():
            state, event = change(self._current(cohort))
            event = replace(event, cohort=cohort)
            if cohort:
                self._write_cohort(cohort, state, event)
            else:
                self._write_default(state, event)
        return state, event

    def _write_default(self, state: RolloutState, event: RolloutEvent) -> None:
        self._db.execute(
            "INSERT INTO rollout_state (id, data, version) VALUES (1, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET data = excluded.data, version = excluded.version",
            (json.dumps(state.to_dict()), state.version),
        )
        self._db.execute(
            "INSERT INTO rollout_history (version, at, data) VALUES (?, ?, ?)",
            (state.version, event.at, json.dumps(event.to_dict())),
        )

    def _write_cohort(self, cohort: str, state: RolloutState, event: RolloutEvent) -> None:
        self._db.execute(
            "INSERT INTO rollout_cohort_state (cohort, data, version) VALUES (?, ?, ?) "
            "ON CONFLICT (cohort) DO UPDATE SET data = excluded.data, version = excluded.version",
            (cohort, json.dumps(state.to_dict()), state.version),
        )
        self._db.execute(
            "INSERT INTO rollout_cohort_history (cohort, version, at, data) VALUES (?, ?, ?, ?)",
            (cohort, state.version, event.at, json.dumps(event.to_dict())),
        )

    @contextmanager
    def _transaction(self, links: bool = False, begin: bool = True) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE takes the write lock before the read, so writers serialise.
        `links`: on the links' own connection (see `_links`). `begin=False` is for a single
        statement, which is a transaction of its own (the connections autocommit)."""
        try:
            with self._links_lock if links else self._lock:
                db = self._links() if links else self._db
                if not begin:
                    yield db
                    return
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"rollout store {self.path}: {exc}") from None

    def history(self, limit: int = 100, cohort: str | None = None) -> list[RolloutEvent]:
        """Both tables, in time order (the default's changes, at their time, belong to every
        cohort's history)."""
        where, args = ("WHERE cohort = ?", (cohort,)) if cohort is not None else ("", ())
        rows = self._query_all(
            "SELECT data FROM (SELECT at, 0 AS seq, version, data FROM rollout_history "
            f"UNION ALL SELECT at, seq, version, data FROM rollout_cohort_history {where} "
            "ORDER BY at DESC, seq DESC, version DESC LIMIT ?) ORDER BY at, seq, version",
            (*args, limit),
        )
        return [decode_event(r[0], self._where) for r in rows]

    def save_pins(self, pins: Sequence[Pin]) -> None:
        if not pins:
            return
        with self._transaction():
            self._db.execute("DELETE FROM rollout_pins WHERE expires_at < ?", (time.time(),))
            self._db.executemany(
                "INSERT OR IGNORE INTO rollout_pins VALUES (?, ?, ?, ?)",
                [(p.conversation, p.backend, p.epoch, p.expires_at) for p in pins],
            )

    def load_pins(self, conversations: Sequence[str] | None = None) -> list[Pin]:
        now = time.time()
        if conversations is None:
            rows = self._query_all("SELECT * FROM rollout_pins WHERE expires_at >= ?", (now,))
        else:
            marks = ",".join("?" * len(conversations))
            rows = self._query_all(
                f"SELECT * FROM rollout_pins WHERE expires_at >= ? AND conversation IN ({marks})",
                (now, *conversations),
            )
        return [Pin(str(r[0]), str(r[1]), int(r[2]), float(r[3])) for r in rows]

    def save_links(self, links: Sequence[Link]) -> None:
        """One statement per LINKS_PER_INSERT links, and a batch that needs one statement
        runs without BEGIN and COMMIT (a statement is its own transaction). The module
        lets go of the GIL at every statement, and with the event loop busy each hand-back
        is a wait: under `--workers`, a batch's statements are what its answers pay for."""
        if not links:
            return
        now = time.time()
        statements: list[tuple[str, list[Any]]] = []
        if now >= self._next_link_sweep:
            statements.append(("DELETE FROM rollout_links WHERE expires_at < ?", [now]))
            self._next_link_sweep = now + LINK_SWEEP_S
        for start in range(0, len(links), LINKS_PER_INSERT):
            chunk = links[start : start + LINKS_PER_INSERT]
            rows = ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
            values = [
                v for k in chunk for v in (k.key, k.conversation, k.turn, k.expires_at, k.detail)
            ]
            statements.append((f"INSERT OR REPLACE INTO rollout_links VALUES {rows}", values))
        with self._transaction(links=True, begin=len(statements) > 1) as db:
            for statement in statements:
                db.execute(*statement)

    def _links(self) -> sqlite3.Connection:
        """The links' connection, at WAL's synchronous=NORMAL for good: links are written
        many times a second and are soft state (a lost one costs a conversation its
        continuity, never a decision), so their commits skip the fsync, as the records
        store's do (a fraction of the CPU per batch: benchmarks/link_flush_cost.py). A crash
        of the process still loses nothing committed; only a power loss can drop the last
        links. Rollout state, on the other connection, keeps FULL; switching one connection
        between the two cost two statements per batch."""
        if self._links_closed:  # as the closed main connection would answer
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
        if self._links_db is None:
            db = sqlite3.connect(
                self.path, timeout=10.0, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA synchronous=NORMAL")
            self._links_db = db
        return self._links_db

    def load_links(self, keys: Sequence[str]) -> list[Link]:
        if not keys:
            return []
        marks = ",".join("?" * len(keys))
        rows = self._query_all(
            f"SELECT * FROM rollout_links WHERE expires_at >= ? AND key IN ({marks})",
            (time.time(), *keys),
        )
        return [Link(str(r[0]), str(r[1]), int(r[2]), float(r[3]), str(r[4])) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._links_lock:
            if self._links_db is not None:
                self._links_db.close()
            self._links_closed = True

    def _query_one(self, sql: str, args: tuple[object, ...] = ()) -> Any:
        try:
            with self._lock:
                row: Any = self._db.execute(sql, args).fetchone()
            return row
        except sqlite3.Error as exc:
            raise StoreError(f"rollout store {self.path}: {exc}") from None

    def _query_all(self, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
        try:
            with self._lock:
                return list(self._db.execute(sql, args).fetchall())
        except sqlite3.Error as exc:
            raise StoreError(f"rollout store {self.path}: {exc}") from None
