"""The writer's contract: never block the caller, count every drop, survive a failing disk."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

import psutil
import pytest
from recorder_support import wait_until

from kvmigrate.proxy.exchange import Exchange
from kvmigrate.recorder import Record, RecorderAddon, WriterSettings, open_store
from kvmigrate.recorder.store import RecordStore
from kvmigrate.recorder.writer import RecordWriter


def _record(i: int) -> Record:
    return Record(
        request_id=f"req_{i}", ts=time.time(), route="chat/completions", backend="hosted",
        role="serve", model="m", served_model="m", conversation=f"c{i % 7}", turn=1, stream=False,
        status=200, ttft_ms=1.0, latency_ms=2.0,
    )  # fmt: skip


class _Blocked(RecordStore):
    """A store whose writes wait on an event: the queue behind it fills up."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__("blocked://")
        self.release = release
        self.rows = 0

    def insert(self, records: object, answered: object = ()) -> None:
        self.release.wait(10)
        self.rows += len(records)  # type: ignore[arg-type]

    def _transaction(self):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def _lock_schema(self, cursor: object) -> None:
        raise NotImplementedError

    def columns(self, table: str) -> set[str]:
        return set()

    def close(self) -> None:
        pass


def test_a_full_queue_drops_and_counts_without_blocking() -> None:
    release = threading.Event()
    store = _Blocked(release)
    writer = RecordWriter(
        lambda: store,
        lambda i: _record(i),
        WriterSettings(queue_size=10, batch_size=5, flush_interval=0),
    )
    writer.start()
    started = time.perf_counter()
    accepted = sum(writer.submit(i) for i in range(1000))
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5  # 1000 submits against a stuck store: no waiting
    assert writer.stats.dropped["queue_full"] == 1000 - accepted
    assert 10 <= accepted <= 20  # the queue, plus at most the batch the writer holds
    release.set()
    writer.stop()
    assert store.rows == accepted == writer.stats.written


def _exchange(i: int) -> Exchange:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    now = time.perf_counter()
    x = Exchange(
        request_id=f"req_{i}", route="chat/completions", backend="hosted", role="serve",
        model="m", served_model="m", conversation="c", turn=1, stream=False,
        started=now - 0.1, request_body=body, status=200, first_byte=now, finished=now,
    )  # fmt: skip
    x.chunks = [b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}]}']
    return x


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_a_failing_store_counts_errors_drops_batches_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, worker: str
) -> None:
    """The worker process's log records come back through this process's logging."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the database's folder should be")
    recorder = RecorderAddon(
        f"sqlite:///{blocker}/records.db",
        settings=WriterSettings(batch_size=3, flush_interval=0.01),
        worker=worker,
        durability="memory",  # a spool, beside the database, would fail too (a second error)
    )
    recorder.start()
    with caplog.at_level(logging.DEBUG, "kvmigrate.recorder"):
        for i in range(3):
            recorder.exchange_done(_exchange(i))
            wait_until(lambda n=i: recorder.stats.write_errors > n)
        recorder.close()
    assert recorder.stats.write_errors == 3
    assert recorder.stats.written == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "writing records failed" in errors[0].getMessage()


def test_batches_hold_many_records_and_close_flushes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    writer = RecordWriter(
        lambda: open_store(url),
        lambda i: _record(i),
        WriterSettings(batch_size=200, flush_interval=0.5),
    )
    for i in range(1000):
        writer.submit(i)
    writer.start()
    writer.stop()
    assert writer.stats.written == 1000
    assert writer.stats.batches <= 6  # batched, not one transaction per record
    with open_store(url) as store:
        assert store.query("SELECT count(*), count(DISTINCT conversation) FROM records") == [
            (1000, 7)
        ]


def test_a_retried_batch_is_not_written_twice(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/r.db") as store:
        batch = [_record(i) for i in range(10)]
        store.insert(batch)
        store.insert(batch)
        assert store.query("SELECT count(*) FROM records") == [(10,)]


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_an_invalid_item_is_dropped_and_counted(tmp_path: Path, worker: str) -> None:
    recorder = RecorderAddon(f"sqlite:///{tmp_path}/r.db", worker=worker)
    recorder.start()
    recorder._writer.submit(("not an exchange", 0.0))
    recorder.close()
    assert recorder.stats.dropped == {"invalid": 1}


def test_a_killed_worker_is_restarted_and_what_it_lost_is_counted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    recorder, worker = _recorder_with_its_worker(url)
    worker.kill()
    worker.wait(10)
    sent = _until_a_new_worker_writes(recorder, sent=1)
    recorder.close(timeout=120)  # all it was sent, written, before the counts are compared
    stats = recorder.stats
    assert stats.dropped.get("worker_lost", 0) >= 1
    assert stats.written + stats.dropped["worker_lost"] == sent
    with open_store(url) as store:
        assert store.query("SELECT count(*) FROM records") == [(stats.written,)]


def test_records_a_worker_could_not_write_before_the_stop_deadline_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker at the lowest priority on a CPU that other work keeps busy may not run at
    all before the proxy's stop deadline: what it had not written (all of it here: the
    worker is stopped with SIGSTOP, as such a CPU would leave it) is counted as dropped
    and named in the log, not reported as zero records still being written."""
    url = f"sqlite:///{tmp_path}/r.db"
    recorder, worker = _recorder_with_its_worker(url)
    worker.suspend()
    try:
        for i in range(1, 41):
            recorder.exchange_done(_exchange(i))
        with caplog.at_level(logging.ERROR, logger="kvmigrate.recorder"):
            recorder.close(timeout=2.0)
        stats = recorder.stats
        assert stats.written == 1
        assert stats.dropped == {"stop_timeout": 40}
        assert "40 records not written" in caplog.text
    finally:
        worker.kill()
        worker.wait(10)
    with open_store(url) as store:
        assert store.query("SELECT count(*) FROM records") == [(1,)]


def test_what_a_dead_worker_had_not_read_from_its_pipe_is_counted_as_lost(tmp_path: Path) -> None:
    """Exchanges fed into a worker's pipe that the worker dies before reading are lost
    with it: counted as worker_lost when the next worker starts, so written + lost is every
    exchange sent, and the rows are the written ones."""
    url = f"sqlite:///{tmp_path}/r.db"
    recorder, worker = _recorder_with_its_worker(url)
    worker.suspend()  # it reads nothing more: what follows stays in its pipe
    for i in range(1, 21):
        recorder.exchange_done(_exchange(i))
    wait_until(lambda: recorder._writer.depth == 0 and _pipe_fed(recorder) == 21, 30)
    worker.kill()
    worker.wait(10)
    sent = _until_a_new_worker_writes(recorder, sent=21)
    recorder.close(timeout=120)
    stats = recorder.stats
    assert stats.dropped["worker_lost"] >= 20
    assert stats.written + stats.dropped["worker_lost"] == sent
    with open_store(url) as store:
        assert store.query("SELECT count(*) FROM records") == [(stats.written,)]


def test_a_killed_worker_loses_nothing_it_was_spooled(tmp_path: Path) -> None:
    """With the spool (record.durability: spool, the default) a worker that dies holding
    records unwritten (stopped first, as a busy machine would leave it) loses none: the
    next worker starts at the last ack, and nothing is counted as lost."""
    url = f"sqlite:///{tmp_path}/r.db"
    recorder, worker = _recorder_with_its_worker(url, durability="spool")
    worker.suspend()
    for i in range(1, 21):
        recorder.exchange_done(_exchange(i))
    worker.kill()
    worker.wait(10)
    sent = _until_a_new_worker_writes(recorder, sent=21, written=21)
    recorder.close(timeout=120)
    assert "worker_lost" not in recorder.stats.dropped
    with open_store(url) as store:
        assert store.query("SELECT count(*) FROM records") == [(sent,)]


def _recorder_with_its_worker(
    url: str, durability: str = "memory"
) -> tuple[RecorderAddon, psutil.Process]:
    """A started recorder that has written one record, and its worker process."""
    # By default through pipes alone (record.durability: memory), where a dead worker loses
    # what it held.
    recorder = RecorderAddon(
        url, settings=WriterSettings(flush_interval=0.01), durability=durability, workers=1
    )
    # This process may hold other children (an earlier test's worker still finishing, a
    # zombie): the worker is the one child that is new since the recorder started.
    before = {p.pid for p in psutil.Process().children()}
    recorder.start()
    recorder.exchange_done(_exchange(0))
    wait_until(lambda: recorder.stats.written == 1, 60)  # a worker starts slowly under load
    (worker,) = [p for p in _spawned_children() if p.pid not in before]
    return recorder, worker


def _until_a_new_worker_writes(recorder: RecorderAddon, sent: int, written: int = 1) -> int:
    """Send exchanges after a worker's death until its successor has written one more than
    `written`; the count of exchanges sent in all. The new worker starts slowly on a loaded
    machine, so this waits longer there (a deadline, not a count of sends)."""
    time.sleep(1.0)  # past the restart throttle
    deadline = time.monotonic() + 60
    while recorder.stats.written <= written:
        recorder.exchange_done(_exchange(sent))
        sent += 1
        time.sleep(0.05)
        assert time.monotonic() < deadline, "the restarted worker wrote nothing"
    return sent


def _pipe_fed(recorder: RecorderAddon) -> int:
    return sum(lane.sent for lane in recorder._writer._lanes)  # type: ignore[attr-defined]


def _spawned_children() -> list[psutil.Process]:
    """This process's live multiprocessing children, not its resource tracker."""
    found = []
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):  # gone, or a zombie: not a running worker
            command = " ".join(p.cmdline())
            if "spawn_main" in command and "resource_tracker" not in command:
                found.append(p)
    return found
