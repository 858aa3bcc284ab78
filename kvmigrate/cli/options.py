"""Options and error handling shared by every command."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from kvmigrate.config import Config, ConfigError, default_config_path, load_config

F = TypeVar("F", bound=Callable[..., Any])


class FiniteRange(click.FloatRange):
    """click's FloatRange that refuses NaN and infinity too: NaN compares false to both
    bounds, so a plain FloatRange let `--gpu-hour-price nan` (or a percent of NaN) through.
    Every float option of the CLI takes this one."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def config_option(func: F) -> F:
    """`--config`, defaulting to $KVMIGRATE_CONFIG or ./config.yaml."""
    return click.option(
        "--config",
        "config_path",
        default=default_config_path,
        show_default="$KVMIGRATE_CONFIG or ./config.yaml",
        type=click.Path(dir_okay=False),
        help="The kvmigrate config file.",
    )(func)


def load_or_exit(path: str, secrets_required: bool = True) -> Config:
    """Load the config, turning any problem into a one-line error and exit code 2.
    Commands that call no backend pass `secrets_required=False`: the proxy's master key
    need not be set to read a report."""
    try:
        return load_config(path, secrets_required=secrets_required)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
