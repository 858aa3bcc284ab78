"""`kvmigrate config check`: validate a config file before a deploy."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from kvmigrate.cli.options import config_option, load_or_exit
from kvmigrate.config import BackendConfig, Config, ConfigError, safe_url
from kvmigrate.config.access import describe_auth
from kvmigrate.config.strict_yaml import read_yaml
from kvmigrate.litellm_bridge.gateway import litellm_problem
from kvmigrate.logtext import printable_lines


@click.group("config")
def config_group() -> None:
    """Inspect and validate the config file."""


@config_group.command("check")
@config_option
def check(config_path: str) -> None:
    """Load the config as the proxy would, and print what it routes where.

    Every `os.environ/NAME` the file references is checked first, so one run names all
    the variables still to set (or set but empty), not only the first."""
    unset = _unset_secrets(config_path)
    if unset:
        raise click.ClickException(
            printable_lines(
                f"{config_path}: {len(unset)} environment variable(s) to set:\n"
                + "\n".join(f"  {path}: {problem}" for path, problem in unset)
            )
        )
    config = load_or_exit(config_path)
    problem = litellm_problem(config)
    if problem:
        raise click.ClickException(printable_lines(f"{config.source}: {problem}"))
    # Names and URLs are the file's: shown with escapes and bidi controls made visible.
    _echo(f"{config.source}: ok")
    for backend in config.backends.values():
        _echo(_backend_line(config, backend))
    for route in config.models:
        served = ", ".join(f"{b}={m}" for b, m in route.served.items())
        _echo(f"  model {route.model_name}: {served}")
    r = config.rollout
    _echo(f"  rollout: mode={r.mode} percent={r.percent:g} shadow_sample={r.shadow_sample:g}")
    _echo("  " + describe_auth(config))


def _echo(text: str) -> None:
    click.echo(printable_lines(text))


def _backend_line(config: Config, backend: BackendConfig) -> str:
    name = backend.name
    role = {config.rollout.primary: "primary", config.rollout.candidate: "candidate"}.get(
        name, "unused"
    )
    auth = "configured key" if backend.api_key else "client key passes through"
    if name != config.rollout.primary and not backend.api_key:
        auth = "no key"
    where = ", ".join(safe_url(base) for base in backend.api_bases)
    if backend.type == "litellm":
        where = "litellm" + (f" at {where}" if where else "")
        if not backend.api_key:
            auth = "litellm reads the provider's credentials from the environment"
    return f"  backend {name} ({role}): {where} [{auth}]"


ENV_PREFIX = "os.environ/"


def _unset_secrets(path: str) -> list[tuple[str, str]]:
    """(key path, problem) for each `os.environ/NAME` whose variable is unset or empty. A
    file that does not parse is left to the loader, which says why. Parsed as the loader
    parses it, so a file it refuses (a key written twice among them) gets its refusal first,
    not a listing of secrets read from a copy with one of the two keys silently dropped."""
    try:
        data = read_yaml(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, UnicodeDecodeError, ConfigError):
        return []
    found = []
    for key_path, value in _strings(data, "", set()):
        name = value[len(ENV_PREFIX) :]
        if not value.startswith(ENV_PREFIX) or not name:
            continue
        current = os.environ.get(name)
        if current is None:
            found.append((key_path, f"environment variable {name} is not set"))
        elif not current:
            found.append((key_path, f"environment variable {name} is set but empty"))
    return found


def _strings(node: Any, path: str, seen: set[int]) -> Iterator[tuple[str, str]]:
    """Every string under `node` with its key path. YAML aliases make one node reachable by
    many paths (a billion-laughs file: 9^25 of them) or by itself (`a: &x [*x]`): each
    container is walked once."""
    if isinstance(node, dict | list):
        if id(node) in seen:
            return
        seen.add(id(node))
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, f"{path}.{key}" if path else str(key), seen)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings(value, f"{path}[{i}]", seen)
    elif isinstance(node, str):
        yield path, node
