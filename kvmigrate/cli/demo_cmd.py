"""`kvmigrate demo`: the whole migration, end to end, with no GPU and no keys."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from kvmigrate.cli.options import FiniteRange, OutputPath
from kvmigrate.demo import DemoSettings, run_demo


@click.command("demo")
@click.option("--conversations", type=click.IntRange(1, 1000), default=24, show_default=True)
@click.option("--turns", type=click.IntRange(1, 50), default=6, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True)
@click.option(
    "--time-scale",
    type=FiniteRange(0, 10),
    default=1.0,
    show_default=True,
    help="Multiply the emulators' latencies (1: real time; TTFT figures scale).",
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
    conversations: int,
    turns: int,
    concurrency: int,
    time_scale: float,
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
    settings = DemoSettings(
        conversations, turns, concurrency, time_scale, bad_candidate, real_vllm, out, workdir, api
    )
    ok = run_demo(settings, click.echo)
    if workdir is not None:
        click.echo(f"state and records kept in {workdir}")
    if not ok:
        raise SystemExit(1)
