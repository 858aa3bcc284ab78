"""`emulate`, `config check` and `demo` given hostile arguments and files: a one-line error
and exit code, never a traceback or a hang. (Kept beside the bench's probes: these
commands have no test folder of their own.)"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kvmigrate.cli import main


def _clean_exit(result: Result, code: int) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == code, result.output


def test_emulate_on_a_port_in_use_says_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "kvmigrate", "emulate", "--profile", "vllm",
             "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_emulate_refuses_a_port_out_of_range(port: str) -> None:
    result = CliRunner().invoke(main, ["emulate", "--profile", "vllm", "--port", port])
    _clean_exit(result, 2)
    assert "--port" in result.output


@pytest.mark.parametrize(
    "text",
    [
        "backends: {hosted: {api_base: 'http://x/v1'}}\nloop: &a [*a]\n",
        "a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 25)),
    ],
    ids=["self-alias", "billion-laughs"],
)
def test_config_check_walks_each_yaml_alias_once(tmp_path: Path, text: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(text)
    result = CliRunner().invoke(main, ["config", "check", "--config", str(config)])
    _clean_exit(result, 1)
    assert str(config) in result.output


def test_demo_refuses_a_report_in_a_missing_folder_before_it_starts(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "report.html"
    result = CliRunner().invoke(main, ["demo", "--out", str(out)])
    _clean_exit(result, 2)
    assert "does not exist" in result.output


def test_demo_refuses_a_workdir_under_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(main, ["demo", "--workdir", str(blocker / "sub")])
    _clean_exit(result, 1)
    assert "cannot use --workdir" in result.output


def test_cachecheck_refuses_a_negative_show(tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    records.write_text("")
    result = CliRunner().invoke(main, ["cachecheck", "--show", "-1", "--dataset", str(records)])
    _clean_exit(result, 1)  # cachecheck's usage errors exit 1: 2 means cache busters found
    assert "-1 is not in the range" in result.output
