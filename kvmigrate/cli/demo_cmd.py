"""`kvmigrate demo`: the whole migration, end to end, with no GPU and no keys."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from kvmigrate.cli.options import FiniteRange, OutputPath
from kvmigrate.demo import FULL, DemoSettings, run_demo

# The option defaults are the short story's, DemoSettings' own; --full starts from FULL,
# and an option given on the command line wins over either.
_SHORT = DemoSettings()


@click.command("demo")
@click.option(
    "--conversations",
    type=click.IntRange(1, 1000),
    help=f"Agent conversations in the shadow phase [default: {_SHORT.conversations}; "
    f"--full: {FULL['conversations']}].",
)
@click.option(
    "--turns",
    type=click.IntRange(1, 50),
    help=f"Model calls per conversation [default: {_SHORT.turns}; --full: {FULL['turns']}].",
)
@click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True)
@click.option(
    "--time-scale",
    type=FiniteRange(0, 10),
    help="Multiply the emulators' latencies (1: real time; TTFT figures scale) "
    f"[default: {_SHORT.time_scale:g}; --full: {FULL['time_scale']:g}].",
)
@click.option(
    "--full",
    is_flag=True,
    help="The longer story: more and longer conversations at real latencies, and more "
    "traffic after each step (about two minutes and a half; the default is under one).",
)
@click.option(
    "--bad-candidate",
    is_flag=True,
    help="The candidate returns broken tool calls: watch the gate refuse it and "
    "auto-rollback pull it out after an override.",
)
@click.option(
    "--vllm",
    "real_vllm",
    is_flag=True,
    help="Use a real vLLM (CPU build, tiny model) as the candidate.",
)
@click.option(
    "--api",
    type=click.Choice(["openai", "anthropic"]),
    default="openai",
    show_default=True,
    help="The API the agents speak: OpenAI's chat completions, or Anthropic's Messages API "
    "(the anthropic SDK, pip install anthropic) against an emulated Anthropic API.",
)
@click.option(
    "--out",
    type=OutputPath(),
    default=None,
    help="The HTML report [default: report.html in --workdir, else in a new temporary "
    "directory; the path is printed].",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the state and records here (default: a temporary directory, deleted at the end).",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the state and records (in a new directory, unless --workdir names one).",
)
def demo(
    conversations: int | None,
    turns: int | None,
    concurrency: int,
    time_scale: float | None,
    full: bool,
    bad_candidate: bool,
    real_vllm: bool,
    api: str,
    out: Path | None,
    workdir: Path | None,
    keep: bool,
) -> None:
    """Shadow agent traffic to an emulated vLLM, report, and roll out 10% -> 50% -> 100%
    through the gates, all on this machine."""
    if workdir is None and keep:
        workdir = Path(tempfile.mkdtemp(prefix="kvmigrate-demo-"))
    if workdir is not None:
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # under a regular file, on a read-only mount
            raise click.ClickException(f"cannot use --workdir {workdir}: {exc.strerror}") from None
    if api == "anthropic":
        try:
            import anthropic  # noqa: F401
        except ImportError:
            raise click.ClickException(
                "--api anthropic drives the agents with the anthropic SDK: pip install anthropic"
            ) from None
    given = {"conversations": conversations, "turns": turns, "time_scale": time_scale}
    chosen: dict[str, Any] = {**(FULL if full else {}), **_given(given)}
    settings = replace(
        _SHORT,
        **chosen,
        concurrency=concurrency,
        bad_candidate=bad_candidate,
        real_vllm=real_vllm,
        out=out,
        workdir=workdir,
        api=api,
    )
    ok = run_demo(settings, click.echo)
    if workdir is not None:
        click.echo(f"state and records kept in {workdir}")
    if not ok:
        raise SystemExit(1)


def _given(options: dict[str, Any]) -> dict[str, Any]:
    """The options the command line set (click leaves the others None)."""
    return {name: value for name, value in options.items() if value is not None}
