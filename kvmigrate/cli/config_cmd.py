"""`kvmigrate config check`: validate a config file before a deploy."""

from __future__ import annotations

import click

from kvmigrate.adapters.litellm_gateway import litellm_problem
from kvmigrate.cli.options import config_option, load_or_exit
from kvmigrate.config import BackendConfig, Config


@click.group("config")
def config_group() -> None:
    """Inspect and validate the config file."""


@config_group.command("check")
@config_option
def check(config_path: str) -> None:
    """Load the config as the proxy would, and print what it routes where."""
    config = load_or_exit(config_path)
    problem = litellm_problem(config)
    if problem:
        raise click.ClickException(f"{config.source}: {problem}")
    click.echo(f"{config.source}: ok")
    for backend in config.backends.values():
        click.echo(_backend_line(config, backend))
    for route in config.models:
        served = ", ".join(f"{b}={m}" for b, m in route.served.items())
        click.echo(f"  model {route.model_name}: {served}")
    r = config.rollout
    click.echo(f"  rollout: mode={r.mode} percent={r.percent:g} shadow_sample={r.shadow_sample:g}")


def _backend_line(config: Config, backend: BackendConfig) -> str:
    name = backend.name
    role = {config.rollout.primary: "primary", config.rollout.candidate: "candidate"}.get(
        name, "unused"
    )
    auth = "configured key" if backend.api_key else "client key passes through"
    if name != config.rollout.primary and not backend.api_key:
        auth = "no key"
    where = ", ".join(backend.api_bases)
    if backend.type == "litellm":
        where = "litellm" + (f" at {where}" if where else "")
        if not backend.api_key:
            auth = "litellm reads the provider's credentials from the environment"
    return f"  backend {name} ({role}): {where} [{auth}]"
