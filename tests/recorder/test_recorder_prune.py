"""`kvmigrate records prune` enforces record.retention_days."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from kvmigrate.recorder import Record, open_store

DAY = 86_400.0


def test_prune_deletes_only_records_past_retention(tmp_path: Path) -> None:
    db = tmp_path / "records.db"
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
record: {{db: "sqlite:///{db}", retention_days: 7}}
"""
    )
    now = time.time()
    with open_store(f"sqlite:///{db}") as store:
        store.insert(
            [
                Record(
                    f"r{age}",
                    now - age * DAY,
                    "chat/completions",
                    "hosted",
                    "serve",
                    "m",
                    "m",
                    "c",
                    1,
                    False,
                    200,
                )
                for age in (1, 6, 8, 30)
            ]
        )
    run = [sys.executable, "-m", "kvmigrate", "records", "prune", "--config", str(config)]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pruned 2 records older than 7 days" in proc.stdout
    with open_store(f"sqlite:///{db}") as store:
        assert sorted(r[0] for r in store.query("SELECT request_id FROM records")) == ["r1", "r6"]
    proc = subprocess.run(
        [*run, "--older-than-days", "2"], capture_output=True, text=True, timeout=60
    )
    assert "pruned 1 records" in proc.stdout
