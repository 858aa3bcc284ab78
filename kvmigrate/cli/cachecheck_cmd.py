"""`kvmigrate cachecheck`: find what in recorded prompts defeats prefix caching."""

from __future__ import annotations

import json

import click

from kvmigrate.cachecheck import CostModel, DatasetError, Summary, check_all, load_dataset
from kvmigrate.cachecheck.text import render_json, render_text
from kvmigrate.cachecheck.waste import DEFAULT_PREFILL_TOKENS_PER_S
from kvmigrate.cli.options import FindingCommand, FiniteRange
from kvmigrate.logtext import printable_lines

EXIT_CLEAN, EXIT_ERROR, EXIT_BUSTERS = 0, 1, 2


@click.command("cachecheck", cls=FindingCommand)
@click.option(
    "--dataset",
    required=True,
    type=click.Path(dir_okay=False),
    help="JSONL of conversations or requests (e.g. `kvmigrate report --export-requests`).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--prefill-rate",
    type=FiniteRange(min=1.0),
    default=DEFAULT_PREFILL_TOKENS_PER_S,
    show_default=True,
    help="Prefill tokens/s of the serving engine (from `kvmigrate bench`).",
)
@click.option(
    "--price-per-mtok",
    type=FiniteRange(min=0.0),
    default=None,
    help="$ per 1M input tokens that should have been cached (uncached minus cached price).",
)
@click.option(
    "--show",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Conversations to list in text.",
)
@click.pass_context
def cachecheck(
    ctx: click.Context,
    dataset: str,
    as_json: bool,
    prefill_rate: float,
    price_per_mtok: float | None,
    show: int,
) -> None:
    """Find what in a team's prompts defeats prefix caching.

    Compares each turn with the previous turn plus its answer, as an append-only agent
    would send it, and names the cause of every break with a fix.

    Exit codes: 0 no cache busters (deliberate history truncation does not count),
    1 bad input, 2 cache busters found.
    """
    try:
        data = load_dataset(dataset)
    except DatasetError as exc:
        raise click.ClickException(str(exc)) from None
    summary = Summary(CostModel(prefill_rate, price_per_mtok))
    checked = []
    for conversation, checks in check_all(data.conversations):
        summary.add(checks)
        checked.append((conversation, checks))
    if as_json:
        click.echo(json.dumps(render_json(checked, summary, data.skipped), indent=2))
    else:
        # Conversation ids and fields come from the dataset: escapes and bidi made visible.
        click.echo(printable_lines(render_text(checked, summary, data.skipped, show)), nl=False)
    breaks, _ = summary.lost(deliberate=False)
    ctx.exit(EXIT_BUSTERS if breaks else EXIT_CLEAN)
