"""What `rollout status`, `rollout history` and `config check` print comes from a config,
a store or an admin API client (cohort names, reasons, actors): a bidi control or an escape
sequence in it is shown as a visible escape, never sent to the terminal."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import load_config
from kvmigrate.recorder.evidence import open_controller

RLO = "\u202e"  # right-to-left override: reverses what follows it on screen
CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: {model}, hosted: m, vllm: m}}
rollout: {{state: "sqlite:///{root}/state.db"}}
record: {{db: "sqlite:///{root}/records.db"}}
"""


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(root=tmp_path, model="gpt-original"))
    controller = open_controller(load_config(str(path)))
    try:  # what an admin API client may send as its reason and actor
        controller.change(
            percent=10, reason=f"ok{RLO}\x1b[2Jgnikcab", actor=f"ops{RLO}", force=True
        )
    finally:
        controller.store.close()
    return str(path)


def _assert_not_raw(output: str) -> None:
    for raw in (RLO, "\u2066", "\x1b"):
        assert raw not in output, output


def _assert_escaped(output: str) -> None:
    _assert_not_raw(output)
    assert "\\u202e" in output


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["rollout", "history"], "reason: ok\\u202e\\x1b[2Jgnikcab"),
        (["rollout", "status"], "by ops\\u202e"),
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
    assert "no model 'x\\u202e' in the config; models: gpt-original" in result.output


def test_a_configured_name_with_a_control_character_is_refused_without_echoing_it(
    tmp_path: Path,
) -> None:
    """A name the config gives (it labels metrics, logs and every table) may not hold a
    bidi control or an escape: refused at load by its key and the character's code."""
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(root=tmp_path, model='"gpt\\u202elanigiro"'))
    result = CliRunner().invoke(main, ["config", "check", "--config", str(path)])
    assert result.exit_code == 1
    _assert_not_raw(result.output)
    assert "models[0].model_name: must not contain control characters; found U+202E" in (
        result.output
    )
