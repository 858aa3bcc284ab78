"""`kill -9` of a recording proxy under load: the file stays whole, and the next start writes
what the dead proxy had spooled, so only the answers of its last moments may be lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import psutil
import pytest
from recorder_support import HOSTED_MODEL, Backends, wait_until

from kvmigrate.recorder.sqlite_store import SqliteStore
from kvmigrate.recorder.store import open_store
from kvmigrate.serving import free_port

# Solo (scripts/test.sh): it waits on a killed proxy's lowest-priority recorder.
pytestmark = pytest.mark.solo

HERE = Path(__file__).parent
# The load runs until this many answers (a count, not a window of time: a busy machine only
# makes it longer), within a generous deadline.
LOAD_ANSWERS = 120
LOAD_DEADLINE_S = 60


@pytest.mark.slow
def test_kill_9_under_load_keeps_the_database_intact(backends: Backends, tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
backends:
  hosted: {{api_base: "{backends.hosted.url}/v1"}}
  vllm: {{api_base: "{backends.vllm.url}/v1"}}
models:
  - {{model_name: {HOSTED_MODEL}, hosted: {HOSTED_MODEL}, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: shadow}}
record: {{db: "sqlite:///{db}", content: full}}
"""
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "kill9_proxy.py"), str(config), str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    answered = 0
    stop = threading.Event()
    killed = threading.Event()
    errors_before_kill: list[str] = []
    lock = threading.Lock()

    def drive() -> None:
        nonlocal answered
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-x", max_retries=0
        )
        with client:
            while not stop.is_set():
                try:
                    client.chat.completions.create(
                        model=HOSTED_MODEL,
                        messages=[{"role": "user", "content": "hello"}],
                        max_tokens=4,
                    )
                except openai.APIError as exc:
                    if not killed.is_set():  # the kill has not been sent: a real failure
                        errors_before_kill.append(repr(exc))
                    return
                with lock:
                    answered += 1

    threads = [threading.Thread(target=drive) for _ in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + LOAD_DEADLINE_S
    while answered < LOAD_ANSWERS and not errors_before_kill:
        assert time.monotonic() < deadline, f"{answered} answers in {LOAD_DEADLINE_S} s"
        time.sleep(0.05)
    # The recorder's workers exit with the proxy; what they had not written waits in the
    # proxy's spool for its next start.
    children = psutil.Process(proc.pid).children()
    assert any("spawn_main" in " ".join(c.cmdline()) for c in children)
    killed.set()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive
    stop.set()
    for t in threads:
        t.join(10)
    proc.stdout.close()
    assert errors_before_kill == []
    assert answered > 100

    _restart_and_count(config, db, answered)


def _restart_and_count(config: Path, db: Path, answered: int) -> None:
    """Start the proxy again: it writes what the dead one had spooled."""
    restarted = subprocess.Popen(
        [sys.executable, str(HERE / "kill9_proxy.py"), str(config), str(free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with open_store(f"sqlite:///{db}") as store:

            def serve() -> int:
                return int(store.query("SELECT count(*) FROM records WHERE role = 'serve'")[0][0])

            # Lost: at most the calls in flight (8 clients) and the answers of the last
            # feed interval before the kill, not yet spooled; the bound is loose for a busy
            # CI machine.
            wait_until(lambda: serve() >= answered - 2 * 8, LOAD_DEADLINE_S)
            assert serve() <= answered + 8  # answered as the kill came, unread by its client
            torn = store.query(
                "SELECT count(*) FROM records WHERE status IS NULL AND error IS NULL"
            )
            assert torn == [(0,)]
            assert isinstance(store, SqliteStore)
            assert store.integrity_check() == "ok"
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(60)
