"""The `kvmigrate` command: thin click commands over library functions."""

from __future__ import annotations

import click

from kvmigrate import __version__
from kvmigrate.cli.bench_cmd import bench
from kvmigrate.cli.cachecheck_cmd import cachecheck
from kvmigrate.cli.config_cmd import config_group
from kvmigrate.cli.demo_cmd import demo
from kvmigrate.cli.doctor_cmd import doctor
from kvmigrate.cli.emulate import emulate
from kvmigrate.cli.parity_cmd import parity
from kvmigrate.cli.proxy_cmd import proxy
from kvmigrate.cli.records_cmd import records_group
from kvmigrate.cli.report_cmd import report
from kvmigrate.cli.rewrite_cmd import rewrite
from kvmigrate.cli.rollout_cmd import rollback, rollout
from kvmigrate.config import NotDirect


class _Group(click.Group):
    """Library errors that are the user's to fix become a one-line message and exit 1."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except NotDirect as exc:
            raise click.ClickException(str(exc)) from None


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="kvmigrate")
def main() -> None:
    """Move LLM agent traffic from a hosted API to self-hosted vLLM, one measured step at a time."""


main.add_command(bench)
main.add_command(cachecheck)
main.add_command(config_group)
main.add_command(demo)
main.add_command(doctor)
main.add_command(emulate)
main.add_command(parity)
main.add_command(proxy)
main.add_command(records_group)
main.add_command(report)
main.add_command(rewrite)
main.add_command(rollout)
main.add_command(rollback)
