"""Helpers for the fault, soak and crash tests: processes, stores, records, the matrix table.

The process helpers live in benchmarks/soak.py (the soak script needs them standalone); they
are loaded from there so the test and the script run the very same code.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from services import missing
from settling import wait_settled

from kvmigrate.recorder.convert import stored_conversation
from kvmigrate.rollout.keys import StoreKeys
from kvmigrate.rollout.sqlite_store import KEY_SECRET
from kvmigrate.serving import free_port

ROOT = Path(__file__).resolve().parents[2]
HOSTED_MODEL = "gpt-4o-mini"
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def load_soak() -> ModuleType:
    """benchmarks/soak.py as a module (benchmarks/ is not a package)."""
    name = "kvmigrate_benchmarks_soak"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "soak.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


soak = load_soak()
ChildProcess = soak.ChildProcess
proxy_process = soak.proxy_process
fetch_metrics = soak.fetch_metrics
metric_sum = soak.metric_sum


def refused_port() -> int:
    """A loopback port nothing listens on: connecting is refused at once."""
    return free_port()


def wait_until(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def query(db: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        try:
            return [tuple(r) for r in conn.execute(sql, params).fetchall()]
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # the writer has not migrated the file yet
                return []
            raise


@dataclass(frozen=True)
class Row:
    """The columns of a record the matrix asserts on."""

    request_id: str
    role: str
    backend: str
    status: int | None
    error: str | None
    fallback_from: str | None
    pair_id: str | None
    stream: bool


def rows_for(
    db: Path, conversation: str, grouped_as: str | None = None, hash_key: bytes | None = None
) -> list[Row]:
    """The records of a session. Redacted records keep a keyed hash of its key as the
    rollout store keys it (`grouped_as`: by default from the SQLite store beside `db`), or
    of the key itself where no store keyed it; hashed with `hash_key` (by default the one
    the SQLite store beside `db` gives)."""
    if grouped_as is None:
        grouped_as = in_sqlite_store(db.parent / "state.db", conversation)
    hash_key = hash_key or records_key(db.parent / "state.db")
    keys = {
        stored_conversation(key, "redacted", hash_key) for key in (conversation, grouped_as) if key
    }
    raw = query(
        db,
        "SELECT request_id, role, backend, status, error, fallback_from, pair_id, stream "
        f"FROM records WHERE conversation IN (?{', ?' * len(keys)}) ORDER BY ts",
        (conversation, *keys),
    )
    return [Row(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7])) for r in raw]


def records_key(state: Path) -> bytes:
    """What the proxy hashes record conversation ids with: derived from the SQLite rollout
    store's secret (no record.hash_key in these configs)."""
    found = query(state, "SELECT value FROM rollout_meta WHERE name = ?", (KEY_SECRET,))
    return StoreKeys(str(found[0][0])).records_key()


def in_sqlite_store(state: Path, conversation: str) -> str:
    """`conversation` as a SQLite rollout store keys it ("" with no store there)."""
    if not state.exists():
        return ""
    found = query(state, "SELECT value FROM rollout_meta WHERE name = ?", (KEY_SECRET,))
    return StoreKeys(str(found[0][0])).conversation(conversation) if found else ""


def wait_rows(
    db: Path,
    conversation: str,
    count: int,
    proxy_url: str,
    timeout: float = 30.0,
    grouped_as: str | None = None,
    hash_key: bytes | None = None,
) -> list[Row]:
    """The conversation's records once `count` are written (the writer flushes every 0.2 s;
    a shadow copy lands only after its own timeout) and the proxy at `proxy_url` has settled:
    nothing in flight, every exchange it counted written, so any record beyond the expected
    ones would be there too."""
    wait_until(
        lambda: len(rows_for(db, conversation, grouped_as, hash_key)) >= count,
        timeout,
        f"{count} records of {conversation}",
    )
    wait_settled(proxy_url, timeout)
    return rows_for(db, conversation, grouped_as, hash_key)


def describe(rows: list[Row]) -> str:
    """A compact cell text: `role backend status|error [fallback_from] [paired]`."""
    parts = []
    for r in rows:
        outcome = r.error or str(r.status)
        text = f"{r.role} {r.backend} {outcome}"
        if r.fallback_from:
            text += f" fallback_from={r.fallback_from}"
        if r.pair_id:
            text += " paired"
        parts.append(text)
    return "; ".join(parts)


class RedisServer:
    """A private redis-server on a free port, stoppable mid-test (the session fixture in
    tests/conftest.py is shared and must not be stopped)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server") or missing("redis-server", "redis-server")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

        def listening() -> bool:
            assert self.proc is not None
            assert self.proc.poll() is None, "redis-server exited"
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", self.port)) == 0

        wait_until(listening, 10, "redis-server to listen")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvmigrate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )


# --- the matrix table ----------------------------------------------------------------------


@dataclass
class Cell:
    mode: str
    fault: str
    client: str  # what the client saw, non-streamed and streamed
    recorded: str
    seconds: float


def render_markdown(cells: list[Cell]) -> str:
    lines = [
        "| mode | fault | what the client saw | what was recorded | s |",
        "|---|---|---|---|---|",
    ]
    for c in sorted(cells, key=lambda c: (c.mode, c.fault)):
        client = c.client.replace("|", "\\|")
        recorded = c.recorded.replace("|", "\\|")
        lines.append(f"| {c.mode} | {c.fault} | {client} | {recorded} | {c.seconds:.1f} |")
    return "\n".join(lines) + "\n"


def render_text(cells: list[Cell]) -> str:
    out = []
    for c in sorted(cells, key=lambda c: (c.mode, c.fault)):
        out.append(f"{c.mode:<6} {c.fault:<22} ({c.seconds:4.1f}s)")
        out.append(f"    client:   {c.client}")
        out.append(f"    recorded: {c.recorded}")
    return "\n".join(out)


def proxy_config(tmp: Path, port: int, hosted: str, vllm: str) -> Path:
    """A proxy in shadow mode at sample 0 on `port`, its state and records in `tmp`: what
    the pool and drain tests start (`model_name` gpt-4o-mini)."""
    path = tmp / "config.yaml"
    path.write_text(f"""
server: {{host: 127.0.0.1, port: {port}, admin_key: sk-admin}}
backends:
  hosted: {{api_base: "{hosted}"}}
  vllm: {{api_base: "{vllm}"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: shadow, shadow_sample: 0, state: "sqlite:///{tmp}/state.db"}}
record: {{db: "sqlite:///{tmp}/records.db"}}
""")
    return path
