"""Config strings that have no business holding a line break, a control character or a
megabyte: a URL (api_base, record.db, rollout.state) with whitespace or a control character
in it is refused, naming its key and the variable it came from, never the value; a host
name, a model's, a backend's or a cohort's name longer than its bound is refused too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmigrate.config import ConfigError, parse_config
from kvmigrate.config.model import (
    HOST_MAX_CHARS,
    MODEL_NAME_MAX_CHARS,
    NAME_MAX_CHARS,
    URL_MAX_CHARS,
)

SECRET = "TOPSECRET8"
GOOD = '"http://127.0.0.1:9/v1"'
MODELS = "models:\n  - {model_name: m, hosted: m, vllm: m}\n"


def _config(hosted: str = GOOD, vllm: str = GOOD, extra: str = "", models: str = MODELS) -> str:
    return f"backends:\n  hosted: {{api_base: {hosted}}}\n  vllm: {{api_base: {vllm}}}\n" + (
        models + extra
    )


def _refusal(text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as refused:
        parse_config(text, env=env or {})
    message = str(refused.value)
    assert SECRET not in message
    assert "\n" not in message
    return message


# (config text, the variable's value, the key path)
URLS_FROM_THE_ENVIRONMENT = {
    "api_base": (_config(hosted="os.environ/U8"), "backends.hosted.api_base"),
    "api_base list": (_config(vllm=f"[{GOOD}, os.environ/U8]"), "backends.vllm.api_base[1]"),
    "litellm api_base": (
        f"backends:\n  hosted: {{type: litellm, api_base: os.environ/U8}}\n"
        f"  vllm: {{api_base: {GOOD}}}\n" + MODELS,
        "backends.hosted.api_base",
    ),
    "record.db": (_config(extra="record: {db: os.environ/U8}\n"), "record.db"),
    "rollout.state": (_config(extra="rollout: {state: os.environ/U8}\n"), "rollout.state"),
}
URL_OF = {
    "backends.hosted.api_base": "http://127.0.0.1:8000/v1",
    "backends.vllm.api_base[1]": "http://127.0.0.1:8000/v1",
    "record.db": "sqlite:///records.db",
    "rollout.state": "sqlite:///state.db",
}
# What may follow a good URL in a variable: each a character no URL holds unescaped.
TAILS = {
    "a line break": ("\n", "0A"),
    "a carriage return": ("\r", "0D"),
    "a tab": ("\t", "09"),
    "a space": (" ", "20"),
    "a NUL": ("\x00", "00"),
    "an escape": ("\x1b[2J", "1B"),
    "a bidi control": ("\u202e", "202E"),
    "a line separator": ("\u2028", "2028"),
}


@pytest.mark.parametrize("tail", TAILS.values(), ids=TAILS.keys())
@pytest.mark.parametrize(
    ("text", "path"), URLS_FROM_THE_ENVIRONMENT.values(), ids=URLS_FROM_THE_ENVIRONMENT.keys()
)
def test_a_url_from_the_environment_with_whitespace_or_a_control_is_refused(
    text: str, path: str, tail: tuple[str, str]
) -> None:
    value = URL_OF.get(path, "http://127.0.0.1:8000/v1") + tail[0] + SECRET
    message = _refusal(text, {"U8": value})
    assert message == (
        f"<config>: {path} (from os.environ/U8): must not contain whitespace or control "
        f"characters; found U+{tail[1]:0>4}"
    )


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (_config(hosted='"http://127.0.0.1:8000/v1\\nTOPSECRET8"'), "backends.hosted.api_base"),
        (_config(extra='record: {db: "sqlite:///r.db\\tTOPSECRET8"}\n'), "record.db"),
        (_config(extra="rollout: {state: 'sqlite:///s.db TOPSECRET8'}\n"), "rollout.state"),
        (_config(extra="server: {host: '127.0.0.1 TOPSECRET8'}\n"), "server.host"),
        (
            "backends:\n  hosted: {type: azure, api_base: "
            + GOOD
            + ", api_version: '2024-10-21 preview'}\n"
            + f"  vllm: {{api_base: {GOOD}}}\n"
            + MODELS,
            "backends.hosted.api_version",
        ),
    ],
)
def test_a_url_or_host_written_with_whitespace_is_refused_at_its_key(text: str, path: str) -> None:
    assert _refusal(text).startswith(f"<config>: {path}: must not contain whitespace")


def test_config_check_refuses_a_line_break_in_an_api_base_from_the_environment(
    tmp_path: Path,
) -> None:
    """The probe's case: `api_base: os.environ/U8` with U8 holding a line break passed
    `config check` and printed the URL across two lines."""
    config = tmp_path / "config.yaml"
    config.write_text(
        _config(hosted="os.environ/U8") + f"rollout: {{state: 'sqlite:///{tmp_path}/s.db'}}\n"
    )
    env = os.environ | {"U8": "http://127.0.0.1:8000/v1\n" + SECRET}
    done = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "config", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "backends.hosted.api_base (from os.environ/U8): must not contain" in done.stderr
    assert SECRET not in done.stdout + done.stderr


def _models(name: str = "m", served: str = "m") -> str:
    """Double-quoted, so YAML escapes (`\\u202e`) give the characters they name."""
    return f'models:\n  - {{model_name: "{name}", hosted: "{served}", vllm: m}}\n'


def _cohort(name: str, model: str = "m") -> str:
    return f'cohorts:\n  - {{name: "{name}", model: {model}, match: {{header: {{x-team: a}}}}}}\n'


def _backend_named(name: str) -> str:
    return (
        f"backends:\n  hosted: {{api_base: {GOOD}}}\n  '{name}': {{api_base: {GOOD}}}\n"
        f"models:\n  - {{model_name: m, hosted: m}}\n"
    )


# (config text that holds a value one character over its bound, the key path, the bound)
OVER_THE_BOUND = {
    "server.host": (
        _config(extra=f"server: {{host: '{'h' * (HOST_MAX_CHARS + 1)}'}}\n"),
        "server.host",
        HOST_MAX_CHARS,
    ),
    "a 5 MB host": (
        _config(extra=f"server: {{host: '{'h' * 5_000_000}'}}\n"),
        "server.host",
        HOST_MAX_CHARS,
    ),
    "api_base": (
        _config(hosted=f"'http://h/{'p' * URL_MAX_CHARS}'"),
        "backends.hosted.api_base",
        URL_MAX_CHARS,
    ),
    "model_name": (
        _config(models=_models(name="n" * (MODEL_NAME_MAX_CHARS + 1))),
        "models[0].model_name",
        MODEL_NAME_MAX_CHARS,
    ),
    "a backend's model": (
        _config(models=_models(served="n" * (MODEL_NAME_MAX_CHARS + 1))),
        "models[0].hosted",
        MODEL_NAME_MAX_CHARS,
    ),
    "a cohort's name": (
        _config(extra=_cohort("c" * (NAME_MAX_CHARS + 1))),
        "cohorts[0].name",
        NAME_MAX_CHARS,
    ),
}


@pytest.mark.parametrize(
    ("text", "path", "bound"), OVER_THE_BOUND.values(), ids=OVER_THE_BOUND.keys()
)
def test_a_string_over_its_bound_is_refused_at_its_key(text: str, path: str, bound: int) -> None:
    message = _refusal(text)
    assert message.startswith(f"<config>: {path}: must be at most {bound} characters; got ")
    assert len(message) < 300


def test_a_backend_name_over_its_bound_is_refused() -> None:
    name = "b" * (NAME_MAX_CHARS + 1)
    assert f": must be at most {NAME_MAX_CHARS} characters; got " in _refusal(_backend_named(name))


@pytest.mark.parametrize(
    "text",
    [
        _config(models=_models(name="m\\u202egpt")),
        _config(models=_models(served="m\\x1b[31m")),
        _config(extra=_cohort("team\\u2028a")),
    ],
)
def test_a_name_with_a_control_character_is_refused(text: str) -> None:
    assert ": must not contain control characters; found U+" in _refusal(text)


def test_values_at_their_bounds_load() -> None:
    host = "h" * HOST_MAX_CHARS
    name = "n" * MODEL_NAME_MAX_CHARS
    text = _config(
        models=_models(name=name, served="served model with spaces"),
        extra=f"server: {{host: '{host}'}}\n" + _cohort("c" * NAME_MAX_CHARS, model=name),
    )
    config = parse_config(text, env={})
    assert config.server.host == host
    assert config.models[0].model_name == name
    assert config.models[0].served["hosted"] == "served model with spaces"
    assert config.cohorts[0].name == "c" * NAME_MAX_CHARS
