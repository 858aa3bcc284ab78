"""`kvmigrate rollout`'s own options (outside probe D): given before a subcommand they are
refused, never silently dropped; a percent that is not a finite number is refused before it
reaches the store or a proxy."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout: {{state: "sqlite:///{root}/state.db"}}
record: {{db: "sqlite:///{root}/records.db"}}
"""


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(root=tmp_path))
    return str(path)


@pytest.mark.parametrize(
    "before",
    [
        ["--config", "{config}"],
        ["--model", "m"],
        ["--json"],
        ["--proxy-url", "http://127.0.0.1:1"],
        ["--percent", "10"],
        ["--mode", "split"],
        ["--force"],
    ],
)
@pytest.mark.parametrize("subcommand", ["status", "history", "auto"])
def test_options_before_a_subcommand_are_refused(
    config_path: str, before: list[str], subcommand: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Somewhere without a ./config.yaml: an ignored option never reaches a command that
    # waits (`auto` walking the steps)
    elsewhere = Path(config_path).parent / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    args = ["rollout", *(a.format(config=config_path) for a in before), subcommand]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert before[0] in result.output
    assert "after the subcommand" in result.output
    assert "Traceback" not in result.output


def test_options_after_the_subcommand_still_apply(config_path: str) -> None:
    result = CliRunner().invoke(
        main, ["rollout", "status", "--config", config_path, "--model", "m", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert '"mode": "shadow"' in result.output


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf"])
@pytest.mark.parametrize("where", [[], ["--proxy-url", "http://127.0.0.1:1"]])
def test_a_percent_that_is_not_a_finite_number_is_refused(
    config_path: str, value: str, where: list[str]
) -> None:
    args = ["rollout", "--config", config_path, *where, f"--percent={value}", "--force"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "--percent" in result.output
    assert "cannot reach" not in result.output  # refused before any request


def test_minus_zero_is_zero_and_changes_nothing_at_zero(config_path: str) -> None:
    result = CliRunner().invoke(main, ["rollout", "--config", config_path, "--percent=-0"])
    assert result.exit_code == 0, result.output
    assert "-0" not in result.output
    assert "nothing changed" in result.output
