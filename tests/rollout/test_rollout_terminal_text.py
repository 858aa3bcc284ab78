"""What `rollout status`, `rollout history` and `config check` print comes from a config,
a store or an admin API client (cohort names, reasons, actors): a bidi control or an escape
sequence in it is shown as a visible escape, never sent to the terminal."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import load_config
from kvmigrate.rollout.configured import open_controller

RLO = "\u202e"  # right-to-left override: reverses what follows it on screen
MODEL = f"gpt{RLO}lanigiro"
CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: "gpt\\u202elanigiro", hosted: "m\\u2066", vllm: m}}
rollout: {{state: "sqlite:///{root}/state.db"}}
record: {{db: "sqlite:///{root}/records.db"}}
"""


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(root=tmp_path))
    controller = open_controller(load_config(str(path)))
    try:  # what an admin API client may send as its reason and actor
        controller.change(
            percent=10, reason=f"ok{RLO}\x1b[2Jgnikcab", actor=f"ops{RLO}", force=True
        )
    finally:
        controller.store.close()
    return str(path)


def _assert_escaped(output: str) -> None:
    for raw in (RLO, "\u2066", "\x1b"):
        assert raw not in output, output
    assert "\\u202e" in output


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["rollout", "history"], "reason: ok\\u202e\\x1b[2Jgnikcab"),
        (["rollout", "status"], "by ops\\u202e"),
        (["config", "check"], "model gpt\\u202elanigiro: hosted=m\\u2066, vllm=m"),
    ],
)
def test_stored_and_configured_text_reaches_the_terminal_escaped(
    config_path: str, args: list[str], shown: str
) -> None:
    result = CliRunner().invoke(main, [*args, "--config", config_path])
    assert result.exit_code == 0, result.output
    _assert_escaped(result.output)
    assert shown in result.output


def test_an_error_naming_the_file_s_values_is_escaped(config_path: str) -> None:
    result = CliRunner().invoke(
        main, ["rollout", "status", "--config", config_path, "--model", f"x{RLO}"]
    )
    assert result.exit_code == 1
    _assert_escaped(result.output)
    assert "no model 'x\\u202e' in the config; models: gpt\\u202elanigiro" in result.output
