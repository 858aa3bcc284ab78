"""Fast checks of the test bed's plumbing that need no vLLM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvmigrate.testbed import tiny_model, vllm_venv
from kvmigrate.testbed.vllm_server import VllmServer, VllmStartError


def test_command_has_the_notes_flags_and_prefix_caching_switch(tmp_path: Path) -> None:
    on = VllmServer(tmp_path, python=Path("py"), port=1234).command()
    off = VllmServer(tmp_path, python=Path("py"), port=1234, prefix_caching=False).command()

    assert on[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-prompt-tokens-details", "--enforce-eager", "--tool-call-parser"):
        assert flag in on
    assert on[on.index("--block-size") + 1] == "32"
    assert "--enable-prefix-caching" in on
    assert "--no-enable-prefix-caching" not in on
    assert "--no-enable-prefix-caching" in off
    assert "--enable-prefix-caching" not in off


def test_a_server_that_dies_fails_fast_with_its_log_and_cleans_up(tmp_path: Path) -> None:
    # The project venv has no vllm, so `python -m vllm...` exits at once.
    server = VllmServer(tmp_path, python=Path(sys.executable), startup_timeout=60)

    with pytest.raises(VllmStartError, match="No module named"):
        server.start()

    assert not server.is_running()
    assert "No module named" in server.log_tail()
    assert server.log_path is None  # the private temp dir (and its log) is gone


def test_venv_location_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_venv.VENV_ENV, "/opt/somewhere")

    assert vllm_venv.venv_python() == Path("/opt/somewhere/bin/python")


def test_model_cache_key_depends_on_the_shape() -> None:
    assert tiny_model.recipe_hash("tiny") != tiny_model.recipe_hash("bench")
    assert tiny_model.padded(1656, 64) == 1664


def test_venv_install_runs_once_and_marks_the_venv_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    installs: list[Path] = []

    def fake_install(target: Path, say: object) -> None:
        installs.append(target)
        (target / "bin").mkdir(parents=True)
        (target / "bin" / "python").touch()

    monkeypatch.setattr(vllm_venv, "_install", fake_install)

    first = vllm_venv.ensure_vllm_venv(venv, log=lambda _msg: None)
    second = vllm_venv.ensure_vllm_venv(venv, log=lambda _msg: None)

    assert first == second == venv / "bin" / "python"
    assert installs == [venv]
    assert vllm_venv.is_ready(venv)


def test_an_unmarked_venv_that_passes_the_check_is_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    monkeypatch.setattr(vllm_venv, "_check", lambda _venv: None)
    monkeypatch.setattr(vllm_venv, "_install", pytest.fail)

    vllm_venv.ensure_vllm_venv(venv, log=lambda _msg: None)

    assert vllm_venv.is_ready(venv)


def test_an_unmarked_venv_that_fails_the_check_is_reinstalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    installs: list[Path] = []
    monkeypatch.setattr(vllm_venv, "_check", lambda _venv: "ModuleNotFoundError: vllm")
    monkeypatch.setattr(vllm_venv, "_install", lambda target, _say: installs.append(target))

    vllm_venv.ensure_vllm_venv(venv, log=lambda _msg: None)

    assert installs == [venv]
    assert vllm_venv.is_ready(venv)
