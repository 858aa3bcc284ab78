"""`kvmigrate rollout` with cohorts: the selector, the refusal that lists the cohorts, the
status table, and the same selector through a running proxy's /admin API."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmigrate.config import parse_config
from kvmigrate.runtime import build_app
from kvmigrate.serving import BackgroundServer

CONFIG = """
server: {{admin_key: adm-secret}}
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama-8b}}
  - {{model_name: gpt-4o, hosted: gpt-4o, vllm: llama-70b}}
cohorts:
  - {{name: billing-bot, model: gpt-4o-mini, match: {{header: {{X-Agent: billing-bot}}}}}}
rollout: {{state: "sqlite:///{tmp}/state.db", steps: [10, 50, 100]}}
record: {{db: "sqlite:///{tmp}/records.db"}}
"""


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(tmp=tmp_path))
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvmigrate", *args], capture_output=True, text=True, timeout=60
    )


def test_without_a_selector_the_change_is_refused_and_the_cohorts_listed(
    config_path: Path,
) -> None:
    refused = cli("rollout", "--percent", "50", "--force", "--config", str(config_path))
    assert refused.returncode != 0
    assert "3 cohorts" in refused.stderr
    assert "billing-bot, gpt-4o-mini, gpt-4o" in refused.stderr
    unknown = cli(
        "rollout", "--model", "billing-bot", "--percent", "5", "--config", str(config_path)
    )
    assert unknown.returncode != 0
    assert "no model 'billing-bot'" in unknown.stderr
    both = cli("rollout", "--model", "gpt-4o", "--cohort", "billing-bot", "--percent", "5")
    assert both.returncode != 0
    assert "not both" in both.stderr


def test_each_cohort_moves_alone_and_status_is_a_table_of_them(config_path: Path) -> None:
    done = cli(
        "rollout", "--model", "gpt-4o-mini", "--percent", "50", "--force",
        "--config", str(config_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "rollout of gpt-4o-mini: shadow 0% -> split 50%" in done.stdout
    done = cli(
        "rollout", "--cohort", "billing-bot", "--mode", "split", "--config", str(config_path)
    )
    assert done.returncode == 0, done.stderr

    table = cli("rollout", "status", "--config", str(config_path))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["COHORT", "MODE", "PERCENT", "CANDIDATE", "LAST", "CHANGE", "NEXT", "STEP"]  # fmt: skip
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"billing-bot", "gpt-4o-mini", "gpt-4o"}
    assert rows["gpt-4o-mini"].split()[1:4] == ["split", "50%", "vllm"]
    assert "100%: traffic waiting" in rows["gpt-4o-mini"]  # no evidence recorded yet
    assert rows["billing-bot"].split()[1:3] == ["split", "0%"]
    assert rows["gpt-4o"].split()[1:3] == ["shadow", "0%"]
    assert "10%:" in rows["gpt-4o"]

    one = json.loads(
        cli(
            "rollout", "status", "--model", "gpt-4o-mini", "--json", "--config", str(config_path)
        ).stdout
    )
    assert (one["cohort"], one["state"]["percent"], one["next_step"]) == ("gpt-4o-mini", 50, 100)

    history = cli("rollout", "history", "--json", "--config", str(config_path))
    assert [e["cohort"] for e in json.loads(history.stdout)] == ["gpt-4o-mini", "billing-bot"]
    mini = cli(
        "rollout", "history", "--model", "gpt-4o-mini", "--json", "--config", str(config_path)
    )
    assert [e["cohort"] for e in json.loads(mini.stdout)] == ["gpt-4o-mini"]

    back = cli("rollback", "--model", "gpt-4o-mini", "--config", str(config_path))
    assert back.returncode == 0, back.stderr
    assert "50% -> 0%" in back.stdout
    refused = cli("rollback", "--config", str(config_path))
    assert refused.returncode != 0
    assert "billing-bot, gpt-4o-mini, gpt-4o" in refused.stderr


@pytest.fixture
def proxy(config_path: Path) -> Iterator[BackgroundServer]:
    config = parse_config(config_path.read_text(), env={})
    server = BackgroundServer(lambda: build_app(config, record=False)).start()
    yield server
    server.stop()


def test_the_admin_api_takes_the_same_selector(proxy: BackgroundServer, config_path: Path) -> None:
    remote = ("--proxy-url", proxy.url, "--admin-key", "adm-secret")
    refused = cli("rollout", "--percent", "10", "--force", *remote)
    assert refused.returncode != 0
    assert "billing-bot, gpt-4o-mini, gpt-4o" in refused.stderr
    done = cli("rollout", "--cohort", "billing-bot", "--percent", "10", "--force", *remote)
    assert done.returncode == 0, done.stderr
    table = json.loads(cli("rollout", "status", "--json", *remote).stdout)
    assert [(s["cohort"], s["state"]["percent"]) for s in table] == [
        ("billing-bot", 10),
        ("gpt-4o-mini", 0),
        ("gpt-4o", 0),
    ]
    history = json.loads(
        cli("rollout", "history", "--cohort", "billing-bot", "--json", *remote).stdout
    )
    assert [e["cohort"] for e in history] == ["billing-bot"]
    back = cli("rollback", "--cohort", "billing-bot", *remote)
    assert back.returncode == 0, back.stderr
    local = json.loads(
        cli(
            "rollout", "status", "--cohort", "billing-bot", "--json", "--config", str(config_path)
        ).stdout
    )
    assert local["state"]["percent"] == 0
