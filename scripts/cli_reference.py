"""Write docs/cli.md from the CLI's own --help, so the reference cannot drift.

python scripts/cli_reference.py          # rewrite docs/cli.md
python scripts/cli_reference.py --check  # exit 1 when docs/cli.md is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvmigrate.cli import main

TARGET = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def render() -> str:
    parts = ["# CLI reference\n", "Generated from `--help` by `scripts/cli_reference.py`.\n"]
    for path, command in _walk(main, ["kvmigrate"]):
        with click.Context(command, info_name=" ".join(path), terminal_width=100) as ctx:
            text = command.get_help(ctx)
        parts.append(f"## `{' '.join(path)}`\n\n```\n{text}\n```\n")
    return "\n".join(parts)


def _walk(command: click.Command, path: list[str]) -> list[tuple[list[str], click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        # The group's context resolves lazily loaded subcommands too.
        with click.Context(command, info_name=path[-1]) as ctx:
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                found += _walk(sub, [*path, name])
    return found


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if TARGET.exists() and TARGET.read_text() == text else 1)
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
