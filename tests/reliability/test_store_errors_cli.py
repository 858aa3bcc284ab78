"""The rollout commands against stores that misbehave: a records database that does not
answer, a rollout store URL that does not parse. Each gets a one-line error and a non-zero
exit, never a traceback, and never the password of the URL it could not use.

Real CLI processes; the unreachable databases are loopback ports nothing listens on.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import pytest
from reliability_support import refused_port, run_cli

PASSWORD = "s3cretPW-9f8e7d6c5b4a"


def write_config(tmp: Path, state: str, records: str) -> Path:
    config = tmp / "config.yaml"
    config.write_text(
        f"""
server: {{host: 127.0.0.1, port: {refused_port()}}}
backends:
  hosted: {{api_base: "http://127.0.0.1:{refused_port()}/v1"}}
  vllm: {{api_base: "http://127.0.0.1:{refused_port()}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: "meta-llama/Llama-3.1-8B-Instruct"}}
rollout: {{primary: hosted, candidate: vllm, mode: shadow, percent: 0, state: "{state}"}}
record: {{db: "{records}", content: redacted}}
"""
    )
    return config


def assert_clean_failure(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Traceback" not in out, out
    assert PASSWORD not in out, out
    assert done.stderr.startswith("Error: "), out
    assert len(done.stderr.strip().splitlines()) == 1, out
    for text in expected:
        assert text in done.stderr, out


@pytest.mark.parametrize(
    "command",
    [["rollout", "status"], ["rollout", "--percent", "10"], ["rollout", "status", "--json"]],
)
def test_gates_over_an_unreachable_records_database_fail_with_one_line(
    command: list[str], tmp_path: Path
) -> None:
    """`rollout status` and a promotion read the gates' evidence from the records
    database; PostgreSQL down must not end in a psycopg traceback."""
    records = f"postgresql://kv:{PASSWORD}@127.0.0.1:{refused_port()}/records"
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/state.db", records)
    done = run_cli(*command, "--config", str(config))
    assert_clean_failure(done, "records database")


@pytest.mark.parametrize("password", ["QZ#" + PASSWORD, "QZ/" + PASSWORD, "QZ?" + PASSWORD])
def test_a_redis_url_that_does_not_parse_never_shows_its_password(
    password: str, tmp_path: Path
) -> None:
    """A generated password with a reserved character, not percent-encoded, makes the URL
    unparseable; the error must say so without echoing the URL (or any part of it that
    the parser took for a port)."""
    state = f"redis://:{password}@127.0.0.1:{refused_port()}/0"
    config = write_config(tmp_path, state, f"sqlite:///{tmp_path}/records.db")
    done = run_cli("rollout", "status", "--config", str(config))
    assert_clean_failure(done, "Redis URL")
    assert "QZ" not in done.stderr, done.stderr


@pytest.mark.parametrize("command", [["report"], ["records", "prune"], ["rollout", "status"]])
def test_a_postgres_url_libpq_cannot_read_never_shows_its_password(
    command: list[str], tmp_path: Path
) -> None:
    """libpq quotes the part of a connection string it refuses: a password with a space
    (not percent-encoded) came back whole in the error. Such a URL is now refused when the
    config loads, by its key and the character, never its value."""
    records = f"postgresql://kv:{PASSWORD} x@127.0.0.1:{refused_port()}/records"
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/state.db", records)
    done = run_cli(*command, "--config", str(config))
    assert_clean_failure(done, "record.db: must not contain whitespace")


@pytest.mark.parametrize("command", [["rollout", "status"], ["rollout", "--percent", "20"]])
def test_a_state_written_by_a_newer_version_fails_with_one_line(
    command: list[str], tmp_path: Path
) -> None:
    """A mode this version does not know was a ValueError traceback."""
    config = write_config(
        tmp_path, f"sqlite:///{tmp_path}/state.db", f"sqlite:///{tmp_path}/records.db"
    )
    assert run_cli("rollout", "--percent", "10", "--force", "--config", str(config)).returncode == 0
    with closing(sqlite3.connect(tmp_path / "state.db")) as db, db:
        for table in ("rollout_state", "rollout_cohort_state"):
            for rowid, data in db.execute(f"SELECT rowid, data FROM {table}").fetchall():
                newer = {**json.loads(data), "mode": "canary"}
                db.execute(
                    f"UPDATE {table} SET data = ? WHERE rowid = ?", (json.dumps(newer), rowid)
                )
    done = run_cli(*command, "--config", str(config))
    assert_clean_failure(done, "cannot read a stored rollout state")
