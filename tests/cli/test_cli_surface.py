"""What a user reads of the CLI: summaries that are whole sentences, and the docs' claims
about `--config` (docs/index.md) and the cache-buster metrics' labels (docs/deployment.md's
metrics table) kept true."""

from __future__ import annotations

import re
from pathlib import Path

import click
from click.testing import CliRunner

from kvmigrate.cachecheck.addon import CacheBusterAddon
from kvmigrate.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs"
HOME = (DOCS / "index.md").read_text()
METRICS_PAGE = (DOCS / "deployment.md").read_text()


def _groups() -> list[list[str]]:
    """The command groups whose listings the command modules write. The top level lists
    the summaries the lazy CLI keeps in `kvmigrate.cli.COMMANDS`, checked there."""
    ctx = click.Context(main)
    found = []
    for name in main.list_commands(ctx):
        if isinstance(main.get_command(ctx, name), click.Group):
            found.append([name])
    return found


def test_command_summaries_are_not_cut_mid_sentence() -> None:
    for group in _groups():
        result = CliRunner().invoke(main, [*group, "--help"], terminal_width=80)
        assert result.exit_code == 0, result.output
        listed = result.output.split("Commands:", 1)[1].splitlines()
        for line in filter(str.strip, listed):
            assert not line.endswith("..."), (group, line)
            assert not line.endswith("(e.g."), (group, line)


def _leaves(command: click.Command, path: str) -> list[tuple[str, click.Command]]:
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        return [
            leaf
            for name in command.list_commands(ctx)
            for leaf in _leaves(command.get_command(ctx, name), f"{path} {name}".strip())  # type: ignore[arg-type]
        ]
    return [(path, command)]


def test_docs_name_exactly_the_commands_without_config() -> None:
    without = set()
    for path, command in _leaves(main, ""):
        if not any("--config" in p.opts for p in command.params):
            without.add(path.split()[0])
    claim = re.search(r"takes `--config`.*?all but (.*?), which need none", HOME, re.S)
    assert claim, "docs/index.md's --config sentence moved"
    assert set(re.findall(r"`(\w+)`", claim.group(1))) == without


def test_docs_give_the_cache_buster_metrics_their_real_labels() -> None:
    addon = CacheBusterAddon(worker="thread")
    for metric in (addon.breaks, addon.tokens_lost, addon.reuse):
        name = metric._name
        rows = METRICS_PAGE.splitlines()
        [row] = [line for line in rows if line.startswith("|") and name in line]
        meaning = row.split("|")[2].strip()
        labels = ", ".join(metric._labelnames)
        if labels:
            assert meaning.startswith(labels + ":"), row
        else:
            assert meaning.startswith("no labels"), row
