"""The gates read their evidence from the records database without ever creating it.

`kvmigrate rollout status` or the admin API asked before any proxy had recorded used to
create an empty records.db (with its lock file) wherever `record.db` pointed: in the working
directory, for a config that names none.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvmigrate.config import parse_config
from kvmigrate.recorder.evidence import records_window_source
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import open_store
from kvmigrate.rollout.store import StoreError


def _config(db: str) -> str:
    return f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
record: {{db: "{db}"}}
"""


def test_a_missing_sqlite_database_is_no_evidence_and_stays_missing(tmp_path: Path) -> None:
    db = tmp_path / "nested" / "records.db"
    windows = records_window_source(parse_config(_config(f"sqlite:///{db}"), env={}))
    assert windows(0.0, "") == {}
    assert not db.parent.exists()


def test_an_existing_database_is_read(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/records.db"
    with open_store(db) as store:
        store.insert(
            [
                Record(
                    request_id="r1",
                    ts=time.time(),
                    conversation="c1",
                    turn=1,
                    backend="vllm",
                    role="serve",
                    route="chat",
                    model="m",
                    served_model="m",
                    stream=False,
                    status=200,
                    ttft_ms=40.0,
                    latency_ms=90.0,
                )
            ]
        )
    windows = records_window_source(parse_config(_config(db), env={}))(0.0, "")
    assert list(windows) == ["vllm"]
    assert windows["vllm"].requests == 1


def test_a_malformed_sqlite_url_is_the_stores_error(tmp_path: Path) -> None:
    windows = records_window_source(parse_config(_config("sqlite://records.db"), env={}))
    with pytest.raises(StoreError, match=r"the gates. evidence: expected sqlite:///relative\.db"):
        windows(0.0, "")
