"""`kvmigrate config check`: validate a config file before a deploy."""

from __future__ import annotations

import click

from kvmigrate.cli.options import config_option, load_or_exit


@click.group("config")
def config_group() -> None:
    """Inspect and validate the config file."""


@config_group.command("check")
@config_option
def check(config_path: str) -> None:
    """Load the config as the proxy would, and print what it routes where."""
    config = load_or_exit(config_path)
    click.echo(f"{config.source}: ok")
    for name, backend in config.backends.items():
        role = {config.rollout.primary: "primary", config.rollout.candidate: "candidate"}.get(
            name, "unused"
        )
        auth = "configured key" if backend.api_key else "client key passes through"
        if name != config.rollout.primary and not backend.api_key:
            auth = "no key"
        click.echo(f"  backend {name} ({role}): {', '.join(backend.api_bases)} [{auth}]")
    for route in config.models:
        served = ", ".join(f"{b}={m}" for b, m in route.served.items())
        click.echo(f"  model {route.model_name}: {served}")
    r = config.rollout
    click.echo(f"  rollout: mode={r.mode} percent={r.percent:g} shadow_sample={r.shadow_sample:g}")
