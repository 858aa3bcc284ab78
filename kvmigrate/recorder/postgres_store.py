"""Records in PostgreSQL: one database for every proxy replica (psycopg 3)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg

from kvmigrate.config import safe_url
from kvmigrate.recorder.store import RecordStore, StoreError
from kvmigrate.sql_migrations import Cursor

# An arbitrary constant: the advisory lock key that serialises migrations across replicas.
_MIGRATION_LOCK = 0x6B766D6967726174


def hide_password(text: str, url: str) -> str:
    """`text` with the URL's password, as written or percent-decoded, replaced by ***."""
    password = None
    with contextlib.suppress(ValueError):  # a URL urlsplit cannot read has none to hide
        password = urlsplit(url).password
    forms = {password, unquote(password)} if password else set()
    for form in sorted(forms, key=len, reverse=True):  # the longer first: no half-hidden one
        text = text.replace(form, "***")
    return text


class PostgresStore(RecordStore):
    dialect = "postgresql"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._conn: psycopg.Connection[Any] | None = None
        self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
            # Autocommit, with explicit transaction blocks: nothing stays open between batches.
            try:
                self._conn = psycopg.connect(
                    self.url.replace("postgres://", "postgresql://", 1),
                    autocommit=True,
                    connect_timeout=10,
                    application_name="kvmigrate-recorder",
                )
            except psycopg.Error as exc:
                # libpq quotes the part of the URL it could not read, which may be the
                # password (one with a space): the message goes to logs and the CLI.
                detail = " ".join(hide_password(str(exc), self.url).split())
                raise StoreError(
                    f"PostgreSQL records database {safe_url(self.url)}: {detail}"
                ) from None
        return self._conn

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    @contextmanager
    def _transaction(self) -> Iterator[Cursor]:
        conn = self._connect()
        with conn.transaction(), conn.cursor() as cursor:
            yield cursor

    def _lock_schema(self, cursor: Cursor) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))

    def columns(self, table: str) -> set[str]:
        rows = self.query(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = ? AND table_schema = current_schema()",
            (table,),
        )
        return {row[0] for row in rows}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
