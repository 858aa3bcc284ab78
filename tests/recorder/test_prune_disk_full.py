"""`kvmigrate records prune` on a disk that fills while it runs, and `kvmigrate report` on a
file damaged where only the query reads: a one-line error and a non-zero exit, never a
traceback, and nothing deleted by halves.

The disk is "full" through RLIMIT_FSIZE on the CLI process: the file opens (its WAL and
shared memory are small), and the prune's delete, which needs WAL space, fails at COMMIT,
as it fails on a full disk.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import open_store

RECORDS = 300


def make_records(db: Path) -> None:
    rows = [
        Record(
            request_id=f"r{i}", ts=1_000.0 + i, route="chat", backend="hosted", role="serve",
            model="m", served_model="m", conversation=f"c{i}", turn=1, stream=False,
            status=200, source="proxy", content="redacted", response_json="x" * 400,
        )
        for i in range(RECORDS)
    ]  # fmt: skip
    with open_store(f"sqlite:///{db}") as store:
        store.insert(rows)  # closing the last connection checkpoints the WAL away


def small_disk() -> None:
    """In the child, before exec: writes beyond 40 kB to any file fail (EFBIG)."""
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, hard))


def test_prune_on_a_full_disk_fails_in_one_line_and_deletes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    make_records(db)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout: {{state: "sqlite:///{tmp_path}/state.db"}}
record: {{db: "sqlite:///{db}"}}
"""
    )
    done = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "records", "prune", "--older-than-days", "0",
         "--config", str(config)],
        capture_output=True, text=True, timeout=120, preexec_fn=small_disk,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Traceback" not in out, out
    assert done.stderr.startswith("Error: "), out
    assert len(done.stderr.strip().splitlines()) == 1, out
    with open_store(f"sqlite:///{db}") as store:
        assert store.query("SELECT COUNT(*) FROM records")[0][0] == RECORDS


def corrupt_last_pages(db: Path, pages: int) -> None:
    """Damage the pages the records were appended to last, not the schema's: the file
    opens, and the damage shows only once a query reads the records."""
    data = bytearray(db.read_bytes())
    size = int.from_bytes(data[16:18], "big") or 65536
    for offset in range(len(data) - pages * size, len(data), 7):
        data[offset] ^= 0x5A
    db.write_bytes(bytes(data))


def test_a_report_on_a_records_file_damaged_past_its_schema_fails_in_one_line(
    tmp_path: Path,
) -> None:
    db = tmp_path / "records.db"
    make_records(db)
    corrupt_last_pages(db, 4)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout: {{state: "sqlite:///{tmp_path}/state.db"}}
record: {{db: "sqlite:///{db}"}}
"""
    )
    done = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "report", "--since", "all", "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Traceback" not in out, out
    assert done.stderr.startswith("Error: "), out
    assert "malformed" in done.stderr, out
