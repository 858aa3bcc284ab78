"""`kvmigrate report`: what the recorded traffic says, as text, md, json or html."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import click

from kvmigrate.cli.options import FiniteRange, config_option, load_or_exit, write_output
from kvmigrate.config import Config, safe_text
from kvmigrate.private_files import private_output
from kvmigrate.recorder.export import export_requests
from kvmigrate.recorder.sqlite_store import nothing_recorded
from kvmigrate.recorder.store import RecordStore, StoreError, database_errors, open_store
from kvmigrate.report import RENDERERS, Prices, Report
from kvmigrate.report.configured import configured_report
from kvmigrate.report.render_scorecard import SCORECARD_RENDERERS

PRICE = FiniteRange(min=0)  # $ per unit: 0 or more
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def parse_since(value: str, now: float) -> float:
    """`24h`, `30m`, `7d`, `all`, or an ISO date/time (UTC unless it says otherwise)."""
    text = value.strip().lower()
    if text == "all":
        return 0.0
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text)
    if match:
        return now - float(match.group(1)) * UNITS[match.group(2)]
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected a duration like 24h, 30m, 7d, 'all', or an ISO date"
        ) from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=datetime.now().astimezone().tzinfo).timestamp()
    return parsed.timestamp()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def open_records(url: str) -> RecordStore | None:
    """The records store, or None for a SQLite file nobody has written yet (a report on it
    is empty, and creating the file as a side effect would only confuse)."""
    try:
        return None if nothing_recorded(url) else open_store(url)
    except StoreError as exc:
        raise click.ClickException(safe_text(str(exc))) from None
    except Exception as exc:  # a driver's error may quote the URL it was given
        problem = safe_text(str(exc))
        raise click.ClickException(f"cannot open the records database: {problem}") from None


@click.command("report")
@config_option
@click.option("--since", default="24h", show_default=True, help="24h, 30m, 7d, all, or a date.")
@click.option("--format", "fmt", type=click.Choice(sorted(RENDERERS)), default="text")
@click.option("--out", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
@click.option(
    "--scorecard",
    is_flag=True,
    help="Only the playbook's checklist: each row's target, both arms, interval and status.",
)
@click.option(
    "--export-requests",
    type=click.Path(dir_okay=False),
    help="Also write the recorded request bodies as OpenAI Batch-style JSONL (for replay).",
)
@click.option(
    "--max-turn",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Turns beyond share one row.",
)
@click.option(
    "--input-price", type=PRICE, default=2.50, show_default=True, help="Hosted $ per 1M input."
)
@click.option(
    "--cached-input-price", type=PRICE, default=1.25, show_default=True, help="$ per 1M cached."
)
@click.option(
    "--cache-write-price",
    type=PRICE,
    default=None,
    help="$ per 1M tokens written to the prompt cache (Anthropic); default 1.25 x input.",
)
@click.option(
    "--output-price", type=PRICE, default=10.00, show_default=True, help="$ per 1M output."
)
@click.option(
    "--gpu-hour-price", type=PRICE, default=3.50, show_default=True, help="$ per GPU-hour."
)
@click.option(
    "--gpu-tokens-per-s",
    type=FiniteRange(min=0, min_open=True),
    default=None,
    help="Output tokens/s one GPU sustains (from `kvmigrate bench`); default: the observed peak.",
)
@click.option(
    "--min-gpus",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="GPUs kept running at least.",
)
def report(
    config_path: str,
    since: str,
    fmt: str,
    out: str | None,
    scorecard: bool,
    export_requests: str | None,
    max_turn: int,
    input_price: float,
    cached_input_price: float,
    cache_write_price: float | None,
    output_price: float,
    gpu_hour_price: float,
    gpu_tokens_per_s: float | None,
    min_gpus: int,
) -> None:
    """Summarise recorded traffic: scorecard, TTFT and decode speed by turn, cache, cost.

    The scorecard is the playbook's checklist; `--scorecard` prints it alone."""
    config = load_or_exit(config_path, secrets_required=False)
    now = time.time()
    start = parse_since(since, now)
    prices = Prices(
        input_per_m=input_price,
        cached_input_per_m=cached_input_price,
        output_per_m=output_price,
        gpu_per_hour=gpu_hour_price,
        gpu_tokens_per_s=gpu_tokens_per_s,
        min_gpus=min_gpus,
        cache_write_per_m=cache_write_price,
    )
    with ExitStack() as stack:
        store = open_records(config.record.db)
        if store is not None:
            stack.enter_context(store)
        # A database that fails mid-read (malformed pages, a lock, PostgreSQL gone) gets
        # one line, as one that does not open does.
        try:
            renderers = SCORECARD_RENDERERS if scorecard else RENDERERS
            text = _render(config, store, start, now, prices, renderers[fmt], max_turn)
        except database_errors() as exc:
            raise click.ClickException(f"reading the records failed: {_one_line(exc)}") from None
        if export_requests:
            try:
                _export(store, start, now, export_requests, config)
            except database_errors() as exc:
                raise click.ClickException(f"exporting requests failed: {_one_line(exc)}") from None
    if out:
        write_output(Path(out), text)  # 0600: it quotes recorded traffic
        click.echo(f"wrote {out}", err=True)
    else:
        click.echo(text, nl=not text.endswith("\n"))


def _render(
    config: Config,
    store: RecordStore | None,
    since: float,
    until: float,
    prices: Prices,
    render: Callable[[Report], str],
    max_turn: int,
) -> str:
    return render(configured_report(config, store, since, until, prices, max_turn))


def _export(
    store: RecordStore | None, since: float, until: float, path: str, config: Config
) -> None:
    try:
        with private_output(Path(path)) as out:  # 0600: whole request bodies
            count = export_requests(store, since, until, out) if store is not None else 0
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None
    hint = ""
    if count == 0 and config.record.content == "none":
        hint = " (record.content is `none`: no request bodies are kept)"
    click.echo(f"exported {count} requests to {path}{hint}", err=True)
