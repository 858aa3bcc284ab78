"""`kvmigrate init`: a config.yaml for a team's own hosted API and vLLM.

The file written is the example config (`example.yaml` in this package, the repository's
`config.yaml`, kept identical by tests/config/test_init.py) with a few values changed in
place: every key keeps its comment, and the comments live in one file. The result is
loaded before it is written, so `init` never leaves a file the proxy would refuse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kvmigrate.config.errors import ConfigError
from kvmigrate.config.loader import parse_config

EXAMPLE = "example.yaml"
# The ports `kvmigrate emulate` serves on for `init --emulated`: vLLM's own default (the
# emulator's default too), and the next one up for the hosted API.
EMULATED_VLLM_PORT = 8000
EMULATED_HOSTED_PORT = 8001
# A value written bare when it is made only of these (URLs and model names are); any other
# is written as a JSON string, which YAML reads as the same string.
_BARE = re.compile(r"[A-Za-z0-9._/:@+%=~-]+")


class InitError(Exception):
    """Why `init` wrote nothing, in one line for the CLI."""


@dataclass(frozen=True, slots=True)
class InitSettings:
    """What `init` writes into the example; the defaults are the example's own values."""

    hosted_url: str = "https://api.openai.com/v1"
    vllm_url: str = "http://127.0.0.1:8000/v1"
    model: str = "gpt-4o-mini"
    vllm_model: str = "meta-llama/Llama-3.1-8B-Instruct"
    port: int = 4000


def emulated(port: int = 4000) -> InitSettings:
    """The settings for the two local emulators `next_steps` starts."""
    return InitSettings(
        hosted_url=f"http://127.0.0.1:{EMULATED_HOSTED_PORT}/v1",
        vllm_url=f"http://127.0.0.1:{EMULATED_VLLM_PORT}/v1",
        port=port,
    )


def example_text() -> str:
    return resources.files("kvmigrate.config").joinpath(EXAMPLE).read_text(encoding="utf-8")


def render_config(settings: InitSettings, example: str | None = None) -> str:
    """The example with the settings' values in place of its own."""
    text = example_text() if example is None else example
    # (the line's text before the value, the example's value, the new value): each is
    # found exactly once, or the example changed under this code and a test says so.
    edits = [
        ("  port: ", "4000", str(settings.port)),
        ("    api_base: ", "https://api.openai.com/v1", settings.hosted_url),
        ("    api_base: ", "http://127.0.0.1:8000/v1", settings.vllm_url),
        ("  - model_name: ", "gpt-4o-mini", settings.model),
        ("    hosted: ", "gpt-4o-mini", settings.model),
        ("    vllm: ", "meta-llama/Llama-3.1-8B-Instruct", settings.vllm_model),
    ]
    for prefix, old, new in edits:
        text = _replace_value(text, prefix, old, new)
    header = (
        "# Written by `kvmigrate init` from kvmigrate's example config: the values for your\n"
        "# endpoints are set below, every other key keeps the example's value and comment.\n"
    )
    return header + text


def _replace_value(text: str, prefix: str, old: str, new: str) -> str:
    """`prefix old   # comment` -> `prefix new   # comment`, the comment kept in its
    column where the new value leaves room (one space at least)."""
    pattern = re.compile(rf"^{re.escape(prefix)}{re.escape(old)}( +#.*)?$", re.MULTILINE)
    found = pattern.findall(text)
    if len(found) != 1:
        raise InitError(f"the example config has {len(found)} lines {prefix.strip()} {old}")
    value = new if _BARE.fullmatch(new) else json.dumps(new)

    def line(match: re.Match[str]) -> str:
        comment = match.group(1)
        if comment is None:
            return prefix + value
        column = len(prefix) + len(old) + len(comment) - len(comment.lstrip())
        return (prefix + value).ljust(column - 1) + " " + comment.lstrip()

    return pattern.sub(line, text)


def write_config(path: Path, settings: InitSettings, force: bool = False) -> None:
    """Write the config to `path`: never over an existing file unless `force`, and never
    a file the loader would refuse."""
    if path.exists() and not force:
        raise InitError(f"{path} exists: pass --force to overwrite it")
    text = render_config(settings)
    try:
        parse_config(text, str(path), env={}, secrets_required=False)
    except ConfigError as exc:
        raise InitError(f"the config would not load: {exc}") from None
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InitError(f"cannot write {path}: {exc.strerror or exc}") from None


def next_steps(path: Path, settings: InitSettings, with_emulators: bool) -> list[str]:
    """What to run next, in order, as the README's "run it by hand" section runs it."""
    config = "" if str(path) == "config.yaml" else f" --config {path}"
    steps = []
    if with_emulators:
        steps += [
            f"kvmigrate emulate --profile hosted --port {EMULATED_HOSTED_PORT} &",
            f"kvmigrate emulate --profile vllm --port {EMULATED_VLLM_PORT} &",
        ]
    steps += [
        f"kvmigrate config check{config}",
        f"kvmigrate doctor --base-url {settings.vllm_url}",
        f"kvmigrate proxy{config} &",
        f"OPENAI_BASE_URL=http://127.0.0.1:{settings.port}/v1 your-agent"
        "   # then: kvmigrate report" + config,
    ]
    return steps
