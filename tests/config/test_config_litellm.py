"""A backend of `type: litellm`: what its config takes and refuses, and the message when
litellm is not installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import ConfigError, Secret, parse_config

BACKENDS = """
backends:
  hosted:
    type: litellm
{hosted}
  vllm: {{api_base: "http://10.0.0.1:8000/v1"}}
models:
  - {{model_name: claude, hosted: bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0, vllm: llama}}
"""


def _text(hosted: str) -> str:
    lines = [line for line in hosted.strip().splitlines() if line.strip()]
    return BACKENDS.format(hosted="\n".join("    " + line for line in lines) or "    {}")


def test_a_litellm_backend_needs_no_api_base() -> None:
    config = parse_config(_text("api_key: os.environ/KEY"), env={"KEY": "sk-bedrock"})
    backend = config.primary
    assert backend.type == "litellm"
    assert backend.api_bases == ()
    assert backend.api_key == Secret("sk-bedrock")
    assert backend.litellm_params == {}
    route = config.route("claude")
    assert route is not None
    assert route.served_name("hosted") == "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0"


def test_litellm_params_read_secrets_from_the_environment_and_never_print_them() -> None:
    text = _text(
        """
api_base: "https://bedrock-runtime.eu-west-1.amazonaws.com/"
litellm_params:
  aws_region_name: eu-west-1
  aws_secret_access_key: os.environ/AWS_SECRET
  num_retries: 2
  drop_params: true
  extra_headers: {x-team: os.environ/TEAM}
  tags: [migration, os.environ/TEAM]
"""
    )
    config = parse_config(text, env={"AWS_SECRET": "aws-very-secret", "TEAM": "team-7"})
    backend = config.primary
    assert backend.api_bases == ("https://bedrock-runtime.eu-west-1.amazonaws.com",)
    assert backend.litellm_params == {
        "aws_region_name": "eu-west-1",
        "aws_secret_access_key": Secret("aws-very-secret"),
        "num_retries": 2,
        "drop_params": True,
        "extra_headers": {"x-team": Secret("team-7")},
        "tags": ["migration", Secret("team-7")],
    }
    assert "aws-very-secret" not in repr(config)
    assert "team-7" not in repr(config)


@pytest.mark.parametrize(
    ("hosted", "path", "reason"),
    [
        ("api_base: [http://a, http://b]", "backends.hosted.api_base", "one URL, not a list"),
        ("api_base: ftp://a", "backends.hosted.api_base", "http"),
        ("litellm_params: [1]", "backends.hosted.litellm_params", "expected a mapping"),
        (
            "litellm_params: {api_key: sk-x}",
            "backends.hosted.litellm_params.api_key",
            "set `api_key` on the backend",
        ),
        (
            "litellm_params: {api_base: 'http://x'}",
            "backends.hosted.litellm_params.api_base",
            "set `api_base` on the backend",
        ),
        (
            "litellm_params: {model: x}",
            "backends.hosted.litellm_params.model",
            "comes from `models:`",
        ),
        (
            "litellm_params: {aws_secret_access_key: os.environ/UNSET_VAR}",
            "backends.hosted.litellm_params.aws_secret_access_key",
            "UNSET_VAR is not set",
        ),
        (
            "litellm_params: {tags: [a, os.environ/UNSET_VAR]}",
            "backends.hosted.litellm_params.tags[1]",
            "UNSET_VAR is not set",
        ),
        (
            "litellm_params: {when: 2024-10-21}",
            "backends.hosted.litellm_params.when",
            "expected a string, number, boolean, list or mapping",
        ),
        ("litelm_params: {}", "backends.hosted.litelm_params", "did you mean 'litellm_params'"),
        ("type: bedrock", "backends.hosted.type", "must be one of openai, azure, litellm"),
    ],
)
def test_bad_litellm_backends_are_refused_with_path(hosted: str, path: str, reason: str) -> None:
    text = _text(hosted)
    if "type: bedrock" in hosted:
        text = text.replace("    type: litellm\n", "")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env={})
    assert caught.value.path == path
    assert reason in caught.value.reason


def test_litellm_params_belong_to_litellm_backends_only() -> None:
    text = """
backends:
  hosted: {api_base: "https://api.openai.com/v1", litellm_params: {num_retries: 2}}
"""
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env={})
    assert caught.value.path == "backends.hosted.litellm_params"
    assert "only a backend of `type: litellm`" in caught.value.reason


@pytest.mark.skipif(
    importlib.util.find_spec("litellm") is not None, reason="litellm is installed here"
)
@pytest.mark.parametrize("command", [["proxy"], ["config", "check"]])
def test_without_litellm_the_cli_says_how_to_install_it(tmp_path: Path, command: list[str]) -> None:
    config = tmp_path / "config.yaml"
    state = f"rollout: {{state: 'sqlite:///{tmp_path}/state.db'}}\n"
    config.write_text(_text("api_key: sk-x") + state)
    proc = subprocess.run(
        [sys.executable, "-m", "kvmigrate", *command, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "backend 'hosted' is type litellm: pip install 'kvmigrate[litellm]'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("command", "backend"),
    [(["bench"], "vllm"), (["doctor"], "vllm"), (["parity", "--dataset", "D"], "hosted")],
)
def test_commands_that_call_backends_themselves_refuse_a_litellm_one(
    tmp_path: Path, command: list[str], backend: str
) -> None:
    """bench, doctor and parity replay call backends over HTTP; a litellm backend's model
    strings are litellm's, and without `api_base` it has no URL at all (bench crashed)."""
    config = tmp_path / "config.yaml"
    config.write_text(
        """
backends:
  hosted: {type: litellm}
  vllm: {type: litellm}
models:
  - {model_name: claude, hosted: bedrock/anthropic.claude-3-haiku, vllm: hosted_vllm/llama}
"""
    )
    dataset = tmp_path / "requests.jsonl"
    dataset.write_text('{"model": "claude", "messages": [{"role": "user", "content": "hi"}]}\n')
    args = [str(dataset) if a == "D" else a for a in command]
    result = CliRunner().invoke(main, [*args, "--config", str(config)])
    assert result.exit_code == 1, result.output
    assert f"backend '{backend}' is type litellm: `kvmigrate {command[0]}` calls" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
