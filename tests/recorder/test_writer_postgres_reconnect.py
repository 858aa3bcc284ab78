"""A PostgreSQL records store whose server dropped the writer's idle connection (a restart,
a failover, an idle timeout in a pooler): the next batch is written on a new connection,
not dropped. Each writer process used to lose its first batch after the server was back.

The real session PostgreSQL; the connection is ended from the server's side with
pg_terminate_backend, as a restart ends it.
"""

from __future__ import annotations

import psycopg

from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import open_store
from kvmigrate.recorder.writer import RecordWriter


def records(start: int, count: int) -> list[Record]:
    return [
        Record(
            request_id=f"r{i}", ts=1.0, route="chat", backend="hosted", role="serve", model="m",
            served_model="m", conversation="c", turn=1, stream=False, status=200,
            source="proxy", content="none",
        )
        for i in range(start, start + count)
    ]  # fmt: skip


def end_recorder_connections(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'kvmigrate-recorder' AND datname = current_database()"
        ).fetchall()
    return len(rows)


def test_a_batch_after_the_server_dropped_the_connection_is_written(pg_url: str) -> None:
    writer = RecordWriter(lambda: open_store(pg_url), convert=lambda item: item)
    try:
        writer.write_records(records(0, 10))
        assert end_recorder_connections(pg_url) == 1
        writer.write_records(records(10, 10))
        assert (writer.stats.written, writer.stats.dropped, writer.stats.write_errors) == (
            20,
            {},
            0,
        )
    finally:
        writer.stop()
    with open_store(pg_url) as store:
        assert store.query("SELECT COUNT(*) FROM records")[0][0] == 20
