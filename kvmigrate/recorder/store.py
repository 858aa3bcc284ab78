"""Where records live: one interface, a SQLite and a PostgreSQL implementation by URL."""

from __future__ import annotations

import logging
import sqlite3
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any, Final, NamedTuple

from kvmigrate.config.secret import safe_url
from kvmigrate.lazy import implementation
from kvmigrate.recorder.record import COLUMNS, Record
from kvmigrate.recorder.schema import MIGRATIONS, MIGRATIONS_TABLE
from kvmigrate.sql_migrations import Cursor, apply_migrations

log = logging.getLogger("kvmigrate.recorder")


class StoreError(Exception):
    """A records database URL that cannot be opened."""


def database_errors() -> tuple[type[Exception], ...]:
    """What a records database raises when it is down, full, locked or not a database at
    all: what a caller turns into a one-line error. psycopg's only once a PostgreSQL URL
    has loaded it (a SQLite user never imports it)."""
    errors: list[type[Exception]] = [StoreError, sqlite3.Error, OSError]
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None:
        errors.append(psycopg.Error)
    return tuple(errors)


INSERT_SQL = (
    f"INSERT INTO records ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
    " ON CONFLICT (request_id) DO NOTHING"
)
UPSERT_MESSAGE_SQL = (
    "INSERT INTO messages (digest, last_seen, body) VALUES (?, ?, ?)"
    " ON CONFLICT (digest) DO UPDATE SET last_seen = excluded.last_seen"
    " WHERE messages.last_seen < excluded.last_seen"
)
TOUCH_MESSAGE_SQL = "UPDATE messages SET last_seen = ? WHERE digest = ? AND last_seen < ?"
# A running total (recorder.tally): the larger one wins, so one written twice counts once.
UPSERT_ANSWERED_SQL = (
    "INSERT INTO answered (source, bucket, role, answers) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (source, bucket, role) DO UPDATE SET answers = excluded.answers"
    " WHERE answered.answers < excluded.answers"
)
UNCLEAN_STOP_SQL = (
    "INSERT INTO unclean_stops (source, ts, replayed) VALUES (?, ?, ?)"
    " ON CONFLICT (source) DO UPDATE SET replayed = unclean_stops.replayed + excluded.replayed"
)
FEEDBACK_COLUMNS = ("id", "ts", "conversation", "response_id", "name", "value", "comment", "source")
INSERT_FEEDBACK_SQL = (
    f"INSERT INTO feedback ({', '.join(FEEDBACK_COLUMNS)})"
    f" VALUES ({', '.join('?' for _ in FEEDBACK_COLUMNS)})"
)
# A message is kept this long past the last record that may reference it: the writer
# refreshes `last_seen` at most this often (kvmigrate.recorder.history.TOUCH_S).
MESSAGE_GRACE_S = 2 * 3600.0


class AnsweredRow(NamedTuple):
    """One row of the `answered` table: a proxy process's total for a minute and role."""

    source: str
    bucket: float
    role: str
    answers: int


class RecordStore(ABC):
    """A records database. Thread-safe: one connection, used by one thread at a time.

    SQL is written with `?` placeholders; a store rewrites them for its driver."""

    dialect: str = ""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.RLock()

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Cursor]:
        """A cursor inside one transaction, committed on exit, rolled back on error."""

    @abstractmethod
    def _lock_schema(self, cursor: Cursor) -> None:
        """Serialise migrations between processes that open the database at once."""

    @abstractmethod
    def close(self) -> None: ...

    def sql(self, text: str) -> str:
        return text

    def migrate(self) -> list[str]:
        """Apply the migrations this database lacks; returns their names."""
        with self._lock, self._transaction() as cursor:
            self._lock_schema(cursor)
            return apply_migrations(cursor, MIGRATIONS, MIGRATIONS_TABLE, self.sql)

    def insert(self, records: Sequence[Record], answered: Sequence[AnsweredRow] = ()) -> None:
        """Write a batch in one transaction: all of it lands, or none (a crash mid-batch
        rolls back). A request id already stored is skipped, so a retried batch is safe;
        so is a total in `answered` no larger than the one stored."""
        if not records and not answered:
            return
        rows = [r.row() for r in records]
        messages = [m for r in records for m in r.messages]
        touched = [(r.ts, d, r.ts) for r in records for d in r.touched]
        with self._lock, self._transaction() as cursor:
            if messages:
                cursor.executemany(self.sql(UPSERT_MESSAGE_SQL), messages)
            if rows:
                cursor.executemany(self.sql(INSERT_SQL), rows)
            if touched:
                cursor.executemany(self.sql(TOUCH_MESSAGE_SQL), touched)
            if answered:
                cursor.executemany(self.sql(UPSERT_ANSWERED_SQL), answered)

    def note_unclean_stop(self, source: str, ts: float, replayed: int) -> None:
        """A proxy process of `source` ended without a clean stop about `ts`; its spool
        gave back `replayed` records."""
        with self._lock, self._transaction() as cursor:
            cursor.execute(self.sql(UNCLEAN_STOP_SQL), (source, ts, replayed))

    def insert_feedback(self, row: Sequence[Any]) -> None:
        """One score from `POST /v1/feedback` (kvmigrate.feedback), in FEEDBACK_COLUMNS order."""
        with self._lock, self._transaction() as cursor:
            cursor.execute(self.sql(INSERT_FEEDBACK_SQL), row)

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement for each of `rows`, in one transaction (a table beside the
        records: kvmigrate.engine.samples)."""
        with self._lock, self._transaction() as cursor:
            cursor.executemany(self.sql(sql), rows)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._transaction() as cursor:
            cursor.execute(self.sql(sql), params)
            return [tuple(row) for row in cursor.fetchall()]

    def applied_migrations(self) -> list[str]:
        return [row[0] for row in self.query(f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY name")]

    @abstractmethod
    def columns(self, table: str) -> set[str]: ...

    def sync_every_commit(self) -> None:
        """Each commit on disk before it returns (record.durability: fsync). PostgreSQL's
        commits are, by default."""
        return None

    def prune(self, before: float) -> int:
        """Delete the records that started before `before` (Unix seconds), the engine
        samples taken before it, and the history messages no kept record can reference any
        more; returns the records deleted."""
        with self._lock, self._transaction() as cursor:
            cursor.execute(self.sql("DELETE FROM records WHERE ts < ?"), (before,))
            removed = int(getattr(cursor, "rowcount", 0) or 0)
            # Scores go with the records they score: the same retention.
            cursor.execute(self.sql("DELETE FROM feedback WHERE ts < ?"), (before,))
            cursor.execute(self.sql("DELETE FROM engine_samples WHERE ts < ?"), (before,))
            cursor.execute(
                self.sql("DELETE FROM messages WHERE last_seen < ?"), (before - MESSAGE_GRACE_S,)
            )
            return removed

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


# The store class for each URL scheme, imported when a URL asks for it: the stores subclass
# RecordStore, so this module cannot import them as it loads (and psycopg loads only for
# PostgreSQL).
STORES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "sqlite": "kvmigrate.recorder.sqlite_store:SqliteStore",
        "postgresql": "kvmigrate.recorder.postgres_store:PostgresStore",
        "postgres": "kvmigrate.recorder.postgres_store:PostgresStore",
    }
)


def open_store(url: str, migrate: bool = True) -> RecordStore:
    """The store for `sqlite:///relative.db`, `sqlite:////absolute.db` or `postgresql://...`."""
    store_class: type[RecordStore] | None = implementation(url, STORES)
    if store_class is None:
        where = safe_url(url)
        raise StoreError(f"unsupported records URL {where!r}: use sqlite:/// or postgresql://")
    store = store_class(url)
    if migrate:
        try:
            store.migrate()
        except BaseException:
            store.close()
            raise
    return store


DAY_S = 86_400.0


def pruner(retention_days: int | None) -> Callable[[RecordStore], None] | None:
    """The writer's maintenance step for `record.retention_days`; None keeps everything."""
    if not retention_days:
        return None

    def prune(store: RecordStore) -> None:
        removed = store.prune(time.time() - retention_days * DAY_S)
        if removed:
            log.info("recorder: pruned %d records older than %d days", removed, retention_days)

    return prune
