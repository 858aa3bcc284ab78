"""`kvmigrate proxy --workers N`: N processes on one port that act as one proxy.

A real `kvmigrate proxy` process in front of emulated backends, the official SDK as client.
Fresh connections are what the kernel spreads among SO_REUSEPORT listeners, so the checks
that must reach every worker open one connection per request.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import psutil
import pytest

from kvmigrate.continuity.link_table import ENV as LINK_TABLE_ENV
from kvmigrate.embedded import emulated_backends
from kvmigrate.serving import free_port

MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "Say hello."}]
DEADLINE_S = 30.0  # generous: a loaded machine is slow, and these are not timings


@dataclass
class Pool:
    proc: subprocess.Popen[bytes]
    url: str
    port: int
    config: Path

    def workers(self) -> list[psutil.Process]:
        """The serving workers: the parent's live direct children, without multiprocessing's
        resource tracker (the recorder's own workers are the workers' children). A child
        that has just exited and is not yet reaped serves nothing."""
        return [child for child in psutil.Process(self.proc.pid).children() if _serving(child)]


def _serving(child: psutil.Process) -> bool:
    try:
        return "resource_tracker" not in " ".join(child.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return False


def _config(tmp: Path, port: int, hosted: str, vllm: str) -> Path:
    path = tmp / "config.yaml"
    path.write_text(f"""
server: {{host: 127.0.0.1, port: {port}, admin_key: sk-admin}}
backends:
  hosted: {{api_base: "{hosted}"}}
  vllm: {{api_base: "{vllm}"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: shadow, shadow_sample: 0, state: "sqlite:///{tmp}/state.db"}}
record: {{db: "sqlite:///{tmp}/records.db"}}
""")
    return path


def _wait_listening(pool: Pool, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while sorted(_listeners(pool)) != sorted(w.pid for w in pool.workers()) or (
        len(pool.workers()) != count
    ):
        assert pool.proc.poll() is None, "the proxy exited"
        assert time.monotonic() < deadline, "the workers did not all listen"
        time.sleep(0.1)


def _listeners(pool: Pool) -> list[int]:
    """The pids of the workers with a listening socket on the pool's port."""
    return [
        worker.pid
        for worker in pool.workers()
        if any(
            c.status == psutil.CONN_LISTEN and c.laddr.port == pool.port
            for c in worker.net_connections("tcp")
        )
    ]


@pytest.fixture
def pool(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pool]:
    """Fast emulators, unless a test asks for another time scale (indirect parameter)."""
    with emulated_backends(time_scale=getattr(request, "param", 0.01)) as backends:
        port = free_port()
        config = _config(tmp_path, port, backends.hosted_url, backends.vllm_url)
        argv = [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(config)]
        with (tmp_path / "proxy.log").open("wb") as log:
            proc = subprocess.Popen([*argv, "--workers", "2"], stdout=log, stderr=log)
            running = Pool(proc, f"http://127.0.0.1:{port}", port, config)
            try:
                _wait_listening(running, 2)
                yield running
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)


def _fresh_client(pool: Pool) -> openai.OpenAI:
    """One connection per request: each lands on the worker the kernel picks."""
    return openai.OpenAI(
        base_url=pool.url + "/v1", api_key="sk-client", default_headers={"Connection": "close"}
    )


def _backends_of(pool: Pool, count: int) -> list[str]:
    client = _fresh_client(pool)
    return [
        client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES).headers[
            "x-kvmigrate-backend"
        ]
        for _ in range(count)
    ]


def _served_count(pool: Pool, answers: int) -> float:
    """The pool's served count once it has counted the `answers` the test read: a worker
    counts an answer just after the client has its last byte, so a scrape at once can find
    the last one uncounted (a loaded machine widens that gap). Then the count as it is."""
    deadline = time.monotonic() + DEADLINE_S
    while _metric(pool, SERVED) < answers:
        assert time.monotonic() < deadline, f"the pool did not count {answers} answers"
        time.sleep(0.05)
    return _metric(pool, SERVED)


def _metric(pool: Pool, pattern: str) -> float:
    with urllib.request.urlopen(pool.url + "/metrics", timeout=DEADLINE_S) as response:
        text = response.read().decode()  # urllib opens a connection per request
    values = [float(v) for v in re.findall(rf"^{pattern} (\S+)$", text, re.MULTILINE)]
    return sum(values)


ROLLOUT = [sys.executable, "-m", "kvmigrate", "rollout"]
# The labels in any order (the multiprocess collector sorts them; one is the cohort).
SERVED = r'kvmigrate_requests_total\{(?=[^}]*backend="hosted")(?=[^}]*role="serve")[^}]*\}'


@pytest.mark.slow
def test_workers_are_processes_listening_on_one_port(pool: Pool) -> None:
    workers = pool.workers()
    assert len(workers) == 2
    assert sorted(_listeners(pool)) == sorted(w.pid for w in workers)
    assert pool.proc.pid not in _listeners(pool)  # the parent serves nothing itself


@pytest.mark.slow
def test_every_worker_maps_the_one_link_table(pool: Pool) -> None:
    """The workers share conversation links in memory: each maps the table file the parent
    made in the pool's private folder."""
    # Once, in a loaded run, a worker's maps lacked the table (not reproduced since): either
    # a child that is no serving worker was counted (the resource tracker inherits the same
    # environment and maps nothing; pool.workers() excludes it by its command line), or a
    # worker started again had not yet mapped it. A worker maps the table before it
    # listens, so ask the listening workers, until each shows it (a deadline, not a timing).
    deadline = time.monotonic() + DEADLINE_S
    while not (tables := _mapped_tables(pool)) or None in tables.values():
        assert time.monotonic() < deadline, f"not every worker maps its table: {tables}"
        time.sleep(0.1)
    assert len(tables) == 2
    assert len(set(tables.values())) == 1
    table = Path(next(iter(tables.values())) or "")
    assert table.parent.stat().st_mode & 0o077 == 0  # private to the proxy's user


def _mapped_tables(pool: Pool) -> dict[int, str | None]:
    """Each listening worker's link table (its environment names it) if it maps it, else
    None; empty until both workers listen."""
    tables: dict[int, str | None] = {}
    listening = _listeners(pool)
    for worker in pool.workers():
        if worker.pid not in listening:
            continue
        try:
            named = worker.environ()[LINK_TABLE_ENV]
            tables[worker.pid] = named if named in {m.path for m in worker.memory_maps()} else None
        except psutil.NoSuchProcess:  # replaced meanwhile: ask again
            return {}
    return tables if len(tables) == 2 else {}


@pytest.mark.slow
def test_metrics_are_summed_across_workers(pool: Pool) -> None:
    # 40 requests on fresh connections: all on one worker by chance is a 2**-39 event.
    assert _backends_of(pool, 40) == ["hosted"] * 40
    # Each scrape lands on either worker; every one of them reports the whole pool.
    assert {_served_count(pool, 40) for _ in range(10)} == {40.0}


@pytest.mark.slow
def test_every_worker_records_to_the_one_records_store(pool: Pool) -> None:
    assert _backends_of(pool, 30) == ["hosted"] * 30
    db = pool.config.parent / "records.db"
    deadline = time.monotonic() + DEADLINE_S
    while _served_rows(db) < 30 or _metric(pool, "kvmigrate_records_written_total") < 30:
        assert time.monotonic() < deadline, "the records did not all arrive"
        time.sleep(0.1)
    assert _served_rows(db) == 30
    # Two writers' sources: each worker's recorder wrote its own share.
    assert len(_sources(db)) == 2


def _served_rows(db: Path) -> int:
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        # The file appears when a worker's recorder connects, its table a moment later (the
        # workers' recorders run at the lowest priority): until then, nothing is recorded.
        if not any(conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'")):
            return 0
        return int(conn.execute("SELECT count(*) FROM records WHERE role = 'serve'").fetchone()[0])


def _sources(db: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        return {str(row[0]) for row in conn.execute("SELECT DISTINCT source FROM records")}


def _split(pool: Pool, percent: int) -> None:
    """`kvmigrate rollout --mode split --percent N`, then until every worker applies it."""
    flags = ["--mode", "split", "--percent", str(percent), "--force"]
    change = subprocess.run(
        [*ROLLOUT, "--config", str(pool.config), *flags],
        capture_output=True,
        text=True,
        check=False,
    )
    assert change.returncode == 0, change.stdout + change.stderr
    version = int(re.search(r"version (\d+)", change.stdout).group(1))  # type: ignore[union-attr]
    # The gauge is the lowest version any live worker applies: every worker has it.
    deadline = time.monotonic() + DEADLINE_S
    while _metric(pool, r"kvmigrate_rollout_version\{[^}]*\}") < version:  # the one cohort
        assert time.monotonic() < deadline, "not every worker applied the change"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_rollout_change_reaches_every_worker(pool: Pool) -> None:
    assert set(_backends_of(pool, 4)) == {"hosted"}
    _split(pool, 100)
    assert set(_backends_of(pool, 20)) == {"vllm"}


def test_a_killed_worker_is_replaced(pool: Pool) -> None:
    assert _backends_of(pool, 10) == ["hosted"] * 10
    # Counted first: a worker counts an answer just after its last byte, and one killed in
    # between loses that count (the test failed so, once in a loaded run).
    assert _served_count(pool, 10) == 10.0
    victim = pool.workers()[0]
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    _wait_listening(pool, 2)
    assert victim.pid not in [w.pid for w in pool.workers()]
    assert _backends_of(pool, 10) == ["hosted"] * 10
    # The dead worker's counts stay in the pool's totals: counters never go backwards.
    assert _served_count(pool, 20) == 20.0


@pytest.mark.slow
@pytest.mark.parametrize("pool", [1.0], indirect=True)  # streams at the emulator's speed
def test_sigterm_drains_streams_then_the_pool_exits(pool: Pool) -> None:
    metrics_dir = Path(pool.workers()[0].environ()["PROMETHEUS_MULTIPROC_DIR"])
    assert metrics_dir.is_dir()
    client = openai.OpenAI(base_url=pool.url + "/v1", api_key="sk-client")
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, max_tokens=100
    )
    chunks = iter(stream)
    next(chunks)  # the stream is open, on one of the workers
    pool.proc.send_signal(signal.SIGTERM)
    rest = list(chunks)  # and it runs to its normal end after the signal
    assert any(c.choices and c.choices[0].finish_reason for c in rest)
    assert pool.proc.wait(60) == 0
    assert not metrics_dir.exists()  # the parent removed the folder it made


def _context(conversation: int, turn: int) -> str:
    """A system prompt that changes every turn, and no timestamp: only continuity helps."""
    topics = ["museums", "beaches", "markets", "trains", "castles", "gardens", "opera"]
    return f"You are a travel assistant. Notes: {topics[(conversation + turn) % 7]} rank high."


def test_conversations_and_chains_continue_on_whichever_worker_gets_the_next_turn(
    pool: Pool,
) -> None:
    """Each turn is sent on a fresh connection the moment the last answer is in, so the
    next turn often reaches the other worker before the first one has written anything
    after its answer: a chat conversation (its system prompt changing every turn) is found
    by the links written while its upstream answered, and a Responses chain by its response
    id, read again a moment later. At a 50% split a conversation that was not found would
    land on either backend."""
    _split(pool, 50)
    client = _fresh_client(pool)
    backends: dict[str, set[str]] = {}
    for number in range(8):
        history: list[dict[str, str]] = [{"role": "user", "content": f"Plan day {number}."}]
        for turn in range(4):
            messages = [{"role": "system", "content": _context(number, turn)}, *history]
            raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
            backends.setdefault(f"chat {number}", set()).add(raw.headers["x-kvmigrate-backend"])
            answer = raw.parse().choices[0].message.content or ""
            history += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "Then?"},
            ]
    for number in range(8):
        previous = None
        for turn in range(4):
            raw_response = client.responses.with_raw_response.create(
                model=MODEL, input=f"Chain {number}, step {turn}.", previous_response_id=previous
            )
            backends.setdefault(f"chain {number}", set()).add(
                raw_response.headers["x-kvmigrate-backend"]
            )
            previous = raw_response.parse().id
    assert {name: b for name, b in backends.items() if len(b) > 1} == {}
    assert _metric(pool, "kvmigrate_chain_misses_total") == 0
    identified = r'kvmigrate_conversation_identity_total\{source="%s"\}'
    # Each worker folds its counts into the shared metrics within a second.
    deadline = time.monotonic() + DEADLINE_S
    while _metric(pool, identified % "continuity") < 8 * 3:  # every later chat turn
        assert time.monotonic() < deadline, "later chat turns were not known by continuity"
        time.sleep(0.05)
    assert _metric(pool, identified % "continuity") == 8 * 3
    assert _metric(pool, identified % "guess") == 0
