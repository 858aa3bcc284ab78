"""A recorder worker works at the lowest priority while it keeps up, and is raised once its
oldest unwritten record has waited a second: a busy machine delays records, never starves
them (kvmigrate.pacer). Real worker processes, real SQLite."""

from __future__ import annotations

import time
from pathlib import Path

from recorder_support import wait_until

from kvmigrate.proxy.exchange import Exchange
from kvmigrate.recorder import RecorderAddon, WriterSettings, open_store


def _exchange(i: int) -> Exchange:
    now = time.perf_counter()
    x = Exchange(
        request_id=f"req_{i}", route="chat/completions", backend="hosted", role="serve",
        model="m", served_model="m", conversation=f"c{i}", turn=1, stream=False,
        started=now - 0.1, request_body=b'{"model": "m", "messages": []}', status=200,
        first_byte=now, finished=now,
    )  # fmt: skip
    x.chunks = [b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}]}']
    return x


def test_a_worker_whose_oldest_record_waits_a_second_is_raised(tmp_path: Path) -> None:
    """Records held back for their batch longer than a second (a long flush interval here,
    a CPU that other work keeps busy in production) raise the worker; it writes them."""
    url = f"sqlite:///{tmp_path}/r.db"
    recorder = RecorderAddon(url, settings=WriterSettings(flush_interval=3.0), workers=1)
    recorder.start()
    try:
        for i in range(10):
            recorder.exchange_done(_exchange(i))
        wait_until(lambda: recorder.stats.raised >= 1, 60)
        wait_until(lambda: recorder.stats.written == 10, 60)
    finally:
        recorder.close(timeout=120)
    with open_store(url) as store:
        assert store.query("SELECT count(*) FROM records") == [(10,)]
