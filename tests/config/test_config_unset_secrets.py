"""Commands that use no credential run without them being set (issue 21 item 15)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmigrate.config import ConfigError, load_config
from kvmigrate.recorder.store import open_store

CONFIG = """
server:
  master_key: os.environ/KVM_TEST_UNSET_MASTER
  metrics_key: os.environ/KVM_TEST_UNSET_METRICS
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1", api_key: os.environ/KVM_TEST_UNSET_OPENAI}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout: {{state: "sqlite:///{tmp}/state.db"}}
record: {{db: "sqlite:///{tmp}/records.db"}}
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVM_TEST_UNSET")}
    return subprocess.run(
        [sys.executable, "-m", "kvmigrate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_report_runs_without_the_proxys_secrets(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(tmp=tmp_path))
    report = _cli("report", "--config", str(config))
    assert report.returncode == 0, report.stderr
    assert "No records" in report.stdout
    # The proxy needs them, and still says which is missing before it starts.
    check = _cli("config", "check", "--config", str(config))
    assert check.returncode != 0
    assert "KVM_TEST_UNSET_MASTER" in check.stderr


def test_an_unset_secret_fails_only_when_used(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(tmp=tmp_path))
    loaded = load_config(config, env={}, secrets_required=False)
    key = loaded.server.master_key
    assert key is not None
    assert not key.matches("")
    with pytest.raises(ConfigError, match="KVM_TEST_UNSET_MASTER is not set"):
        key.reveal()
    with pytest.raises(ConfigError, match="not set"):
        load_config(config, env={})


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        # plan reads the records (empty here) and calls no backend
        (["plan"], "no requests with token counts to replay"),
        (["rollout", "status"], "mode shadow, candidate share 0%"),
        (["rollout", "history"], "no changes recorded yet"),
    ],
)
def test_commands_that_call_no_backend_run_without_its_secrets(
    tmp_path: Path, args: list[str], shown: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(tmp=tmp_path))
    open_store(f"sqlite:///{tmp_path}/records.db").close()  # an empty records database
    done = _cli(*args, "--config", str(config))
    assert "KVM_TEST_UNSET" not in done.stdout + done.stderr
    assert shown in done.stdout + done.stderr
