"""A click group whose subcommands are imported only when one of them runs.

This is click's documented lazy-loading pattern, plus one addition: `--help` lists the
commands from summaries kept beside their import paths, so listing them imports none of
them (their dependencies, openai and libcst among them, take most of a second to load).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, NamedTuple

import click


class LazyCommand(NamedTuple):
    """Where a subcommand lives ("module:attribute") and its one-line help."""

    target: str
    summary: str


class LazyGroup(click.Group):
    """A group that imports a subcommand's module on first use."""

    def __init__(self, *args: Any, lazy_commands: Mapping[str, LazyCommand], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = self.lazy_commands.get(cmd_name)
        if lazy is None:
            return super().get_command(ctx, cmd_name)
        # Python's module cache makes a second lookup cheap, so the group keeps no cache.
        return load_command(lazy.target)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The listing click would print, built from the summaries of unloaded commands."""
        stand_ins: dict[str, click.Command] = {
            name: click.Command(name, help=lazy.summary)
            for name, lazy in self.lazy_commands.items()
        }
        click.Group(commands={**stand_ins, **self.commands}).format_commands(ctx, formatter)


def load_command(target: str) -> click.Command:
    """Import "module:attribute" and check that it is a click command."""
    module_name, _, attribute = target.partition(":")
    command = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{target} is not a click command")
    return command
