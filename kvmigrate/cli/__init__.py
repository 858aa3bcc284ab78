"""The `kvmigrate` command: thin click commands over library functions."""

from __future__ import annotations

import click

from kvmigrate import __version__
from kvmigrate.cli.config_cmd import config_group
from kvmigrate.cli.emulate import emulate
from kvmigrate.cli.proxy_cmd import proxy
from kvmigrate.cli.rewrite_cmd import rewrite
from kvmigrate.cli.rollout_cmd import rollback, rollout


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kvmigrate")
def main() -> None:
    """Move LLM agent traffic from a hosted API to self-hosted vLLM, one measured step at a time."""


main.add_command(config_group)
main.add_command(emulate)
main.add_command(proxy)
main.add_command(rollout)
main.add_command(rollback)
main.add_command(rewrite)
