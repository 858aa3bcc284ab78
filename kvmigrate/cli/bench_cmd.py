"""`kvmigrate bench`: TTFT per turn of multi-turn conversations, optionally against a second
endpoint (`--vs`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import click
import openai

from kvmigrate.bench import (
    Conversation,
    DatasetError,
    RunSettings,
    Summary,
    Target,
    TurnRecord,
    load_dataset,
    run_bench,
    summarize,
    synthetic,
)
from kvmigrate.bench.chart import html_report
from kvmigrate.bench.render import report_json, table
from kvmigrate.cli.options import (
    BaseURL,
    FiniteRange,
    OutputPath,
    config_option,
    load_or_exit,
    prefer_env,
    with_candidate,
    write_output,
)
from kvmigrate.progress import progress

_POSITIVE = click.IntRange(min=1)


def _target(
    ctx: click.Context, config_path: str, base_url: str | None, model: str | None, key: str | None
) -> Target:
    if base_url:
        return Target(base_url.rstrip("/"), model, key or "EMPTY", base_url)
    if ctx.get_parameter_source("config_path") is click.core.ParameterSource.DEFAULT and not (
        Path(config_path).exists()
    ):
        raise click.UsageError("give --base-url (or --config with a candidate backend)")
    target = Target.candidate_of(with_candidate(load_or_exit(config_path), "bench"))
    return Target(target.base_url, model or target.model, key or target.api_key, target.label)


def _run_all(
    plan: Sequence[tuple[Target, Sequence[Conversation]]], settings: RunSettings
) -> list[Summary]:
    total = sum(len(c.user_turns) for _, convs in plan for c in convs)
    summaries = []
    with progress(total, "turns", show_pos=True, width=30) as bar:

        def advance(_record: TurnRecord) -> None:
            bar.update(1)

        # One endpoint after the other: run together they would compete for this machine.
        for target, conversations in plan:
            run = asyncio.run(run_bench(target, conversations, settings, advance))
            summaries.append(summarize(run))
    return summaries


@click.command(context_settings={"show_default": True})
@click.option("--base-url", type=BaseURL(), help="The endpoint to measure, e.g. "
              "http://127.0.0.1:8000/v1 [default: the config's candidate backend].")  # fmt: skip
@click.option(
    "--vs",
    "vs_url",
    type=BaseURL(),
    help="A second endpoint to compare against (e.g. the hosted API).",
)
@click.option("--model", help="Model to request [default: the first one the endpoint lists].")
@click.option("--vs-model", help="Model for --vs [default: --model, else its first listed].")
@click.option("--api-key", envvar="KVMIGRATE_BENCH_API_KEY", help="Bearer key for --base-url. "
              + prefer_env("KVMIGRATE_BENCH_API_KEY"))  # fmt: skip
@click.option("--vs-api-key", envvar="KVMIGRATE_BENCH_VS_API_KEY", help="Bearer key for --vs "
              "[default: --api-key]. " + prefer_env("KVMIGRATE_BENCH_VS_API_KEY"))  # fmt: skip
@click.option("--conversations", type=_POSITIVE, default=16, help="Conversations to run.")
@click.option("--turns", type=_POSITIVE, default=8, help="Turns per conversation.")
@click.option("--system-tokens", type=click.IntRange(min=0), default=1000,
              help="Synthetic system prompt length (about one token per word).")  # fmt: skip
@click.option("--turn-tokens", type=_POSITIVE, default=100,
              help="Synthetic user message length per turn.")  # fmt: skip
@click.option("--max-tokens", type=_POSITIVE, default=32, help="max_tokens of every answer.")
@click.option("--concurrency", type=_POSITIVE, default=4, help="Conversations in flight at once.")
@click.option("--dataset", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSONL of conversations (OpenAI messages or ShareGPT) instead of "
              "synthetic ones.")  # fmt: skip
@click.option("--seed", type=int, help="Seed for the synthetic text (same shapes every run).")
@click.option("--timeout", type=FiniteRange(min=1), default=120.0, help="Seconds per turn.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
@click.option("--html", "html_path", type=OutputPath(),
              help="Also write a self-contained HTML chart to this file.")  # fmt: skip
@config_option
@click.pass_context
def bench(
    ctx: click.Context,
    base_url: str | None,
    vs_url: str | None,
    model: str | None,
    vs_model: str | None,
    api_key: str | None,
    vs_api_key: str | None,
    conversations: int,
    turns: int,
    system_tokens: int,
    turn_tokens: int,
    max_tokens: int,
    concurrency: int,
    dataset: Path | None,
    seed: int | None,
    timeout: float,
    as_json: bool,
    html_path: Path | None,
    config_path: str,
) -> None:
    """Measure TTFT per turn of multi-turn conversations that resend their whole history.

    Every turn streams its answer with usage, so cached prompt tokens show when the server
    reports them. With --vs conversations of the same text (with new openings, so nothing
    starts cached) run against a second endpoint, and the table adds the TTFT reduction
    per turn. A --dataset is replayed as it is on both.
    """
    targets = [_target(ctx, config_path, base_url, model, api_key)]
    if vs_url:
        targets.append(
            Target(vs_url.rstrip("/"), vs_model or model, vs_api_key or api_key or "EMPTY", vs_url)
        )
    plan: list[tuple[Target, Sequence[Conversation]]] = []
    for target in targets:
        if dataset is not None:
            try:
                convs = load_dataset(dataset, conversations, turns)
            except DatasetError as exc:
                raise click.ClickException(str(exc)) from None
        else:
            # Same text for every endpoint, new openings each: nothing starts warm.
            convs = synthetic(conversations, turns, system_tokens, turn_tokens, seed)
        plan.append((target, convs))
    settings = RunSettings(concurrency=concurrency, max_tokens=max_tokens, timeout_s=timeout)
    try:
        summaries = _run_all(plan, settings)
    except (openai.APIError, RuntimeError) as exc:
        raise click.ClickException(f"could not start the benchmark: {exc}") from None
    main_run, vs = summaries[0], (summaries[1] if len(summaries) > 1 else None)
    if html_path is not None:
        write_output(html_path, html_report(main_run, vs))
    if as_json:
        click.echo(json.dumps(report_json(main_run, vs), indent=2))
    else:
        click.echo(table(main_run, vs))
        if html_path is not None:
            click.echo(f"chart: {html_path}")
    if any(s.errors == s.requests for s in summaries):
        raise click.ClickException("every request failed; see the error counts above")
