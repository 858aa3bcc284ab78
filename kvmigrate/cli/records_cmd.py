"""`kvmigrate records prune`: enforce `record.retention_days` on the records database."""

from __future__ import annotations

import time

import click

from kvmigrate.cli.options import config_option, load_or_exit
from kvmigrate.cli.report_cmd import open_records
from kvmigrate.config import safe_url
from kvmigrate.recorder.store import database_errors

DAY_S = 86_400.0


@click.group("records")
def records_group() -> None:
    """Maintain the records database."""


@records_group.command("prune", short_help="Delete records older than record.retention_days.")
@config_option
@click.option(
    "--older-than-days",
    type=click.IntRange(min=0),
    default=None,
    help="Delete records older than this; default: record.retention_days.",
)
def prune(config_path: str, older_than_days: int | None) -> None:
    """Delete records older than the retention period (the proxy also prunes hourly)."""
    config = load_or_exit(config_path, secrets_required=False)
    days = config.record.retention_days if older_than_days is None else older_than_days
    store = open_records(config.record.db)
    if store is None:
        click.echo(f"no records database at {safe_url(config.record.db)}: nothing to prune")
        return
    with store:
        try:
            removed = store.prune(time.time() - days * DAY_S)
        except database_errors() as exc:
            # A full disk, a lock held too long: the delete is one transaction, so nothing
            # was removed, and a traceback would say neither.
            detail = " ".join(str(exc).split())
            raise click.ClickException(f"pruning failed, nothing was deleted: {detail}") from None
    click.echo(f"pruned {removed} records older than {days} days")
