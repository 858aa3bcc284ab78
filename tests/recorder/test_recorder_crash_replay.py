"""A proxy killed outright (`kill -9`, the OOM killer) loses no answer it had spooled: its
recorder workers exit with it, and its next start writes the spool it left. Real proxy
processes (tests/recorder/kill9_proxy.py), real emulators, real SQLite and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import openai
import psutil
import psycopg
import pytest
from recorder_support import HOSTED_MODEL, VLLM_MODEL, Backends, wait_until

from kvmigrate.exchange import STATE_FIELDS
from kvmigrate.recorder.spool import EXCHANGES, SpoolReader
from kvmigrate.recorder.sqlite_store import SqliteStore
from kvmigrate.recorder.store import open_store
from kvmigrate.serving import free_port

# Solo (scripts/test.sh): it waits on a killed proxy's lowest-priority recorder.
pytestmark = pytest.mark.solo

HERE = Path(__file__).parent
ANSWERS = 40
DEADLINE_S = 120  # generous: a loaded machine is slow; these are not timings
_ROLE = STATE_FIELDS.index("role")


def _config(tmp_path: Path, backends: Backends, db: str, spool: Path | None = None) -> Path:
    config = tmp_path / "config.yaml"
    spool_dir = f', spool_dir: "{spool}"' if spool else ""
    config.write_text(
        f"""
backends:
  hosted: {{api_base: "{backends.hosted.url}/v1"}}
  vllm: {{api_base: "{backends.vllm.url}/v1"}}
models:
  - {{model_name: {HOSTED_MODEL}, hosted: {HOSTED_MODEL}, vllm: {VLLM_MODEL}}}
rollout: {{mode: shadow, shadow_sample: 0, noise_sample: 0}}
record: {{db: "{db}", content: full{spool_dir}}}
"""
    )
    return config


def _start(config: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "kill9_proxy.py"), str(config), str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _recorder_workers(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(proc.pid).children():
        command = " ".join(child.cmdline())
        if "spawn_main" in command and "resource_tracker" not in command:
            found.append(child)
    return found


def _ask(port: int, count: int) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-x", max_retries=0)
    with client:
        for i in range(count):
            client.chat.completions.create(
                model=HOSTED_MODEL, messages=[{"role": "user", "content": f"hello {i}"}]
            )


def _spooled_answers(root: Path) -> int:
    """The client answers in every lane of every spool under `root`, read as a worker would
    (from its last ack)."""
    total = 0
    for lane in root.glob("*/lane*"):
        reader = SpoolReader(lane)
        try:
            for frame in reader.read(1 << 30):
                if frame.kind == EXCHANGES:
                    items = msgspec.msgpack.decode(frame.payload)
                    total += sum(1 for item in items if item[_ROLE] == "serve")
        finally:
            reader.close()
    return total


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.mark.slow
def test_a_proxy_killed_after_answering_n_requests_has_n_records_after_its_restart(
    backends: Backends, tmp_path: Path
) -> None:
    """The recorder's workers are stopped (SIGSTOP, as a busy machine would leave them at
    their low priority) before any answer, so nothing is written before the kill: every
    record after the restart came from the dead process's spool."""
    db = tmp_path / "records.db"
    config = _config(tmp_path, backends, f"sqlite:///{db}")
    port = free_port()
    proc = _start(config, port)
    workers = _recorder_workers(proc)
    assert workers
    for worker in workers:
        worker.suspend()
    _ask(port, ANSWERS)
    # Spooled a few milliseconds after each answer, by the proxy's feeder thread.
    wait_until(lambda: _spooled_answers(Path(f"{db}.spool")) == ANSWERS, DEADLINE_S)
    _kill(proc)
    for worker in workers:
        worker.kill()
    psutil.wait_procs(workers, timeout=30)

    restarted = _start(config, free_port())
    try:
        with open_store(f"sqlite:///{db}") as store:

            def serve() -> int:
                return int(store.query("SELECT count(*) FROM records WHERE role = 'serve'")[0][0])

            wait_until(lambda: serve() >= ANSWERS, DEADLINE_S)
            assert serve() == ANSWERS
            # Noted once the replay has read every lane of the spool.
            stops = "SELECT source, replayed FROM unclean_stops"
            wait_until(lambda: store.query(stops), DEADLINE_S)
            [(source, replayed)] = store.query(stops)
            assert source.endswith(f":{proc.pid}")
            assert replayed == ANSWERS
            counted = store.query("SELECT sum(answers) FROM answered WHERE role = 'serve'")
            assert counted == [(ANSWERS,)]
            assert isinstance(store, SqliteStore)
            assert store.integrity_check() == "ok"
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(60) == 0
        assert restarted.stdout is not None
        restarted.stdout.close()
    assert not Path(f"{db}.spool").exists()  # written, so removed


def test_a_recorder_worker_exits_with_its_killed_proxy_even_mid_write(
    backends: Backends, tmp_path: Path, pg_url: str
) -> None:
    """A worker whose proxy is gone has nothing left to do (the proxy's next start writes
    the spool): it exits, even while its write waits, here forever, on a table lock."""
    config = _config(tmp_path, backends, pg_url, spool=tmp_path / "spool")
    port = free_port()
    proc = _start(config, port)
    workers = _recorder_workers(proc)

    def table_exists() -> bool:
        with psycopg.connect(pg_url) as conn:
            return conn.execute("SELECT to_regclass('records')").fetchone() != (None,)

    wait_until(table_exists, DEADLINE_S)  # the workers open the store as they start
    with psycopg.connect(pg_url) as locker:
        locker.execute("LOCK TABLE records IN ACCESS EXCLUSIVE MODE")
        _ask(port, 5)

        def a_write_waits() -> bool:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                waiting = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND application_name = 'kvmigrate-recorder'"
                ).fetchone()
            return waiting is not None and waiting[0] > 0

        wait_until(a_write_waits, DEADLINE_S)
        _kill(proc)
        _gone, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive, [w.pid for w in alive]
        locker.rollback()
