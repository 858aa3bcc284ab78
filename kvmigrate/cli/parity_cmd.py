"""`kvmigrate parity`: replay a request dataset against the primary and the candidate, and
gate on the noise-adjusted parity: exit 1 below `--min-score`, 2 for a bad dataset or
option, 3 when there are too few noise samples to tell."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from kvmigrate.cli.options import FiniteRange, OutputPath, config_option, load_or_exit, write_output
from kvmigrate.datasets import DatasetError
from kvmigrate.logtext import printable_lines
from kvmigrate.parity.dataset import load_dataset
from kvmigrate.parity.details import (
    BaselineError,
    compare_runs,
    details_jsonl,
    read_baseline,
    request_verdicts,
)
from kvmigrate.parity.noise import NoiseSettings
from kvmigrate.parity.offline import summarise
from kvmigrate.parity.render import render_changes, render_json, render_text, verdict
from kvmigrate.parity.replay import ItemResult, ReplaySettings, run_replay, targets_from_config
from kvmigrate.parity.semantic import SemanticScorer, load_semantic
from kvmigrate.progress import progress


def _semantic(enabled: bool) -> SemanticScorer | None:
    if not enabled:
        return None
    scorer = load_semantic()
    if scorer is None:
        click.echo("semantic similarity skipped: install kvmigrate[semantic]", err=True)
    return scorer


@click.command("parity", context_settings={"show_default": True})
@config_option
@click.option(
    "--dataset",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="JSONL of OpenAI request bodies, or `kvmigrate report --export-requests` output.",
)
@click.option("--repeats", type=click.IntRange(min=0), default=1,
              help="Extra primary calls per request, for the noise floor.")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(min=1), default=8,
              help="Requests in flight at once.")  # fmt: skip
@click.option("--min-score", type=FiniteRange(0.0, 1.0), default=None,
              help="Fail (exit 1) when the noise-adjusted parity, or any comparator's, is "
              "below this; exit 3 when too few noise samples to tell.")  # fmt: skip
@click.option("--min-noise-samples", type=click.IntRange(min=1), default=20,
              help="Primary-vs-primary pairs a comparator needs for a verdict.")  # fmt: skip
@click.option("--timeout", type=FiniteRange(min=0.1), default=120.0,
              help="Seconds per backend call.")  # fmt: skip
@click.option("--semantic/--no-semantic", default=False,
              help="Add embedding similarity (needs the [semantic] extra).")  # fmt: skip
@click.option("--details", type=OutputPath(), default=None,
              help="Write one JSONL line per request: its verdict, the comparators it diverged "
              "on beyond its own noise, the scores and both answers (redacted).")  # fmt: skip
@click.option("--baseline", type=click.Path(exists=True, dir_okay=False), default=None,
              help="An earlier run's --json report or --details file: report the new "
              "divergences and the fixed ones, and exit 1 on a new divergence.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def parity(
    config_path: str,
    dataset: str,
    repeats: int,
    concurrency: int,
    min_score: float | None,
    min_noise_samples: int,
    timeout: float,
    semantic: bool,
    details: Path | None,
    baseline: str | None,
    as_json: bool,
) -> None:
    """Replay requests against the primary and the candidate and report parity beyond noise.

    Each request goes to the candidate once and to the primary 1 + REPEATS times; the
    primary's repeats measure how much it disagrees with itself, and only the candidate's
    disagreement beyond that counts. Tool calls are compared, never executed."""
    config = load_or_exit(config_path)
    try:
        items = load_dataset(dataset)
    except DatasetError as exc:
        raise click.BadParameter(str(exc), param_hint="--dataset") from None
    try:
        earlier = read_baseline(baseline) if baseline else None
    except BaselineError as exc:
        raise click.BadParameter(str(exc), param_hint="--baseline") from None
    primary, candidate = targets_from_config(config)
    settings = ReplaySettings(repeats=repeats, concurrency=concurrency, timeout_s=timeout)
    scorer = _semantic(semantic)
    with progress(len(items), "requests", show_pos=True, width=30) as bar:

        def advance(_result: ItemResult) -> None:
            bar.update(1)

        results = asyncio.run(
            run_replay(items, primary, candidate, settings, semantic=scorer, on_done=advance)
        )
    report = summarise(results, NoiseSettings(min_noise_samples=min_noise_samples))
    result = verdict(report, min_score)
    requests = list(request_verdicts(results))
    changes = compare_runs(earlier, requests) if earlier is not None else None
    if details:
        write_output(details, details_jsonl(results))
    if as_json:
        extra = {"per_request": requests, "changes": changes.to_dict() if changes else None}
        click.echo(render_json(report, result, min_score, extra))
    else:
        # Request ids and backends' errors are the dataset's and the backends' own text.
        click.echo(printable_lines(render_text(report, result)))
        if changes is not None:
            click.echo(printable_lines(render_changes(changes)))
    regressed = changes is not None and bool(changes.new_divergences)
    sys.exit(result.exit_code or (1 if regressed else 0))
