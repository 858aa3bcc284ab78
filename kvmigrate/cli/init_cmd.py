"""`kvmigrate init`: write a commented config.yaml for your hosted API and your vLLM."""

from __future__ import annotations

from pathlib import Path

import click

from kvmigrate.cli.options import BaseURL, config_option
from kvmigrate.config.init import InitError, InitSettings, emulated, next_steps, write_config

DEFAULTS = InitSettings()


@click.command("init")
@click.option(
    "--hosted-url",
    type=BaseURL(),
    default=DEFAULTS.hosted_url,
    show_default=True,
    help="The hosted API clients use today (the primary).",
)
@click.option(
    "--vllm-url",
    type=BaseURL(),
    default=DEFAULTS.vllm_url,
    show_default=True,
    help="Your vLLM's OpenAI-compatible base URL (the candidate).",
)
@click.option(
    "--model",
    default=DEFAULTS.model,
    show_default=True,
    help="The model name clients send, served by the hosted API under the same name.",
)
@click.option(
    "--vllm-model",
    default=DEFAULTS.vllm_model,
    show_default=True,
    help="The model vLLM serves in its place (its --served-model-name).",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=DEFAULTS.port,
    show_default=True,
    help="The proxy's port.",
)
@click.option(
    "--emulated",
    "emulated_backends",
    is_flag=True,
    help="Point at the local emulators `kvmigrate emulate` serves (no GPU, no keys); "
    "prints the commands that start them.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@config_option
@click.pass_context
def init(
    ctx: click.Context,
    hosted_url: str,
    vllm_url: str,
    model: str,
    vllm_model: str,
    port: int,
    emulated_backends: bool,
    force: bool,
    config_path: str,
) -> None:
    """Write a commented config.yaml for your hosted API and your vLLM: the example config
    with your URLs and model names, every other key with its default and its comment."""
    if emulated_backends:
        given = [
            f"--{name.replace('_', '-')}"
            for name in ("hosted_url", "vllm_url", "model", "vllm_model")
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        ]
        if given:
            raise click.UsageError(f"--emulated sets the URLs and models; drop {given[0]}")
        settings = emulated(port)
    else:
        settings = InitSettings(hosted_url, vllm_url, model, vllm_model, port)
    path = Path(config_path)
    try:
        write_config(path, settings, force=force)
    except InitError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"wrote {path}: {settings.model} from {settings.hosted_url} (primary), "
        f"{settings.vllm_model} at {settings.vllm_url} (candidate), in shadow mode"
    )
    click.echo("next:")
    for step in next_steps(path, settings, emulated_backends):
        click.echo(f"  {step}")
