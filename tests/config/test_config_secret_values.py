"""A config error never prints a secret: a value read from `os.environ/NAME` is named by its
variable, a URL written in the file is shown without its password or query credential,
and `config check` shows backends' URLs the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmigrate.config import ConfigError, parse_config

PASSWORD = "hunter2-Zebra"
BACKENDS = """backends:
  hosted: {{api_base: {hosted}}}
  vllm: {{api_base: {vllm}}}
"""
MODELS = "models:\n  - {model_name: m, hosted: m, vllm: m}\n"
GOOD = '"http://127.0.0.1:9/v1"'


def _config(hosted: str = GOOD, vllm: str = GOOD, extra: str = "") -> str:
    return BACKENDS.format(hosted=hosted, vllm=vllm) + MODELS + extra


def _refusal(text: str, env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as refused:
        parse_config(text, env=env)
    message = str(refused.value)
    assert PASSWORD not in message
    assert "hunter2" not in message
    return message


# (config text, the variable's value, the key path, what the reason says)
FROM_THE_ENVIRONMENT = {
    "record.db": (
        _config(extra="record: {db: os.environ/RECORDS_URL}\n"),
        f"mysql://app:{PASSWORD}@db/kv",
        "record.db (from os.environ/RECORDS_URL)",
        "expected a URL starting with sqlite:// or postgresql:// or postgres://; got the "
        "value of that variable",
    ),
    "rollout.state redis": (
        _config(extra="rollout: {state: os.environ/STATE_URL}\n"),
        f"redis//:{PASSWORD}@cache:6379/0",
        "rollout.state (from os.environ/STATE_URL)",
        "expected a URL starting with sqlite:// or redis:// or rediss://",
    ),
    "rollout.state sqlite": (
        _config(extra="rollout: {state: os.environ/STATE_URL}\n"),
        f"sqlite3:////var/lib/state.db?password={PASSWORD}",
        "rollout.state (from os.environ/STATE_URL)",
        "got the value of that variable",
    ),
    "api_base": (
        _config(vllm="os.environ/VLLM_URL"),
        f"ftp://app:{PASSWORD}@gpu-1/v1",
        "backends.vllm.api_base (from os.environ/VLLM_URL)",
        "expected a http/https URL, got the value of that variable",
    ),
    "api_base without a host": (
        _config(vllm="os.environ/VLLM_URL"),
        f"http://app:{PASSWORD}/v1",
        "backends.vllm.api_base (from os.environ/VLLM_URL)",
        "expected a http/https URL: Port could not be cast to integer value",
    ),
    "api_base list": (
        _config(vllm=f"[{GOOD}, os.environ/VLLM_URL]"),
        f"http//app:{PASSWORD}@gpu-2/v1",
        "backends.vllm.api_base[1] (from os.environ/VLLM_URL)",
        "expected a http/https URL, got the value of that variable",
    ),
    "litellm api_base": (
        "backends:\n  hosted: {type: litellm, api_base: os.environ/GATEWAY}\n"
        f"  vllm: {{api_base: {GOOD}}}\n" + MODELS,
        f"https://app:{PASSWORD}@[gateway/v1",
        "backends.hosted.api_base (from os.environ/GATEWAY)",
        "expected a http/https URL: Invalid IPv6 URL",
    ),
    "a choice": (
        _config(extra="rollout: {mode: os.environ/MODE}\n"),
        PASSWORD,
        "rollout.mode (from os.environ/MODE)",
        "must be one of shadow, split, observe; got the value of that variable",
    ),
}


@pytest.mark.parametrize(
    ("text", "value", "path", "reason"),
    FROM_THE_ENVIRONMENT.values(),
    ids=FROM_THE_ENVIRONMENT.keys(),
)
def test_a_bad_value_from_the_environment_is_named_by_its_variable(
    text: str, value: str, path: str, reason: str
) -> None:
    variable = path.split("os.environ/", 1)[1].rstrip(")")
    message = _refusal(text, {variable: value})
    assert message.startswith(f"<config>: {path}: ")
    assert reason in message


# Written in the file: shown, less the password and any credential in the query.
IN_THE_FILE = {
    "record.db": (
        _config(extra=f"record: {{db: 'mysql://app:{PASSWORD}@db/kv'}}\n"),
        "record.db: expected a URL starting with sqlite:// or postgresql:// or postgres://; "
        "got 'mysql://app:***@db/kv'",
    ),
    "rollout.state": (
        _config(extra=f"rollout: {{state: 'redis//:{PASSWORD}@cache:6379/0'}}\n"),
        "rollout.state: expected a URL starting with sqlite:// or redis:// or rediss://; "
        "got 'redis//***@cache:6379/0'",
    ),
    "api_base": (
        _config(vllm=f"'ftp://app:{PASSWORD}@gpu-1/v1?api-key={PASSWORD}'"),
        "backends.vllm.api_base: expected a http/https URL, got "
        "'ftp://app:***@gpu-1/v1?api-key=***'",
    ),
    "api_base without a host": (
        _config(vllm=f"'http://app:{PASSWORD}/v1'"),
        "backends.vllm.api_base: expected a http/https URL: Port could not be cast to "
        "integer value",
    ),
}


@pytest.mark.parametrize(("text", "reason"), IN_THE_FILE.values(), ids=IN_THE_FILE.keys())
def test_a_bad_url_in_the_file_is_shown_without_its_password(text: str, reason: str) -> None:
    assert _refusal(text, {}) == f"<config>: {reason}"


@pytest.mark.parametrize(
    "api_base",
    [
        f"http://app:{PASSWORD}@127.0.0.1:9/v1",
        f"http://127.0.0.1:9/v1?api-key={PASSWORD}",
        f"http://127.0.0.1:9/v1?sig={PASSWORD}&x=1",
    ],
)
def test_config_check_shows_no_secret_of_an_api_base(tmp_path: Path, api_base: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        _config(vllm="os.environ/VLLM_URL", hosted=f"'{api_base}'")
        + f"rollout: {{state: 'sqlite:///{tmp_path}/s.db'}}\n"
    )
    env = os.environ | {"VLLM_URL": api_base}
    done = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "config", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "backend hosted (primary): http://" in done.stdout
    assert "backend vllm (candidate): http://" in done.stdout
    assert "***" in done.stdout
    assert PASSWORD not in done.stdout + done.stderr
