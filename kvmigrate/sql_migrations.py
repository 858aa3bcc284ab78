"""The one runner of named, append-only schema migrations, for every SQL store we own.

Each migration runs once per database, in order, and its name goes into the store's
migrations table in the same transaction (as simonw/llm does): a crash mid-way leaves the
database at the last whole migration, and a later open applies what is missing. Never edit
or reorder a migration that has shipped: append a new one. The records store and the
rollout store each keep their own list and their own table, so both can live in one file.

The runner does not open the transaction: the caller does, holding whatever lock keeps two
processes from migrating at once (SQLite's `BEGIN IMMEDIATE`, a PostgreSQL advisory lock),
and the runner reads what is applied only after that lock is taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def executemany(self, sql: str, params_seq: Sequence[Sequence[Any]]) -> Any: ...
    def fetchall(self) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class Migration:
    """SQL statements, then optionally a step in Python on the same cursor (for what SQL
    cannot say, such as rehashing keys), all in the transaction that records `name`."""

    name: str
    statements: tuple[str, ...]
    step: Callable[[Cursor], None] | None = None


def migrations_table(table: str) -> str:
    """The DDL of a migrations table (the SQL means the same to SQLite and PostgreSQL)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} "
        "(name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
    )


def check_names(migrations: Sequence[Migration]) -> None:
    """Names are unique: the table is keyed by them, so a repeated one would never run."""
    seen: set[str] = set()
    for migration in migrations:
        if migration.name in seen:
            raise ValueError(f"migration {migration.name!r} is listed twice")
        seen.add(migration.name)


def apply_migrations(
    cursor: Cursor,
    migrations: Sequence[Migration],
    table: str,
    sql: Callable[[str], str] = str,
) -> list[str]:
    """Apply, inside the caller's transaction, the migrations `table` does not name yet, in
    order; returns their names. `sql` rewrites `?` placeholders for the driver."""
    check_names(migrations)
    cursor.execute(migrations_table(table))
    cursor.execute(f"SELECT name FROM {table}")
    done = {row[0] for row in cursor.fetchall()}
    applied: list[str] = []
    for migration in migrations:
        if migration.name in done:
            continue
        for statement in migration.statements:
            cursor.execute(statement)
        if migration.step is not None:
            migration.step(cursor)
        cursor.execute(
            sql(f"INSERT INTO {table} (name, applied_at) VALUES (?, ?)"),
            (migration.name, time.time()),
        )
        applied.append(migration.name)
    return applied
