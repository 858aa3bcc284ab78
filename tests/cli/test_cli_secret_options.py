"""Every option that takes a secret reads it from an environment variable too, and its
--help says to prefer that: a command line is visible to every user in `ps`."""

from __future__ import annotations

import re

import click

from kvmigrate.cli import main

_SECRET_WORDS = ("key", "token", "secret", "password")


def _commands(command: click.Command, path: list[str]) -> list[tuple[str, click.Command]]:
    found = [(" ".join(path), command)]
    if isinstance(command, click.Group):
        with click.Context(command, info_name=path[-1]) as ctx:
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                found += _commands(sub, [*path, name])
    return found


def _secret_options() -> list[tuple[str, click.Option]]:
    options = []
    for path, command in _commands(main, ["kvmigrate"]):
        for param in command.params:
            last_word = re.split(r"[-_]", (param.name or "").lower())[-1]
            is_text = isinstance(param.type, click.types.StringParamType)
            if isinstance(param, click.Option) and is_text and last_word in _SECRET_WORDS:
                options.append((f"{path} {param.opts[0]}", param))
    return options


def test_every_secret_option_prefers_the_environment() -> None:
    found = _secret_options()
    names = {name for name, _ in found}
    # The ones an outside probe named, found by the walk (and so checked below).
    assert {"kvmigrate rollout status --admin-key", "kvmigrate rewrite --proxy-key",
            "kvmigrate emulate --api-key"} <= names, names  # fmt: skip
    for name, option in found:
        assert isinstance(option.envvar, str), name
        assert f"Prefer setting {option.envvar}" in (option.help or ""), name
        assert "`ps`" in (option.help or ""), name
