"""Options and error handling shared by every command."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from kvmigrate.config import Config, ConfigError, default_config_path, load_config
from kvmigrate.config.secret import safe_url
from kvmigrate.logtext import printable_lines
from kvmigrate.private_files import write_private

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
    """Load the config, turning any problem into a one-line error and exit code 1.
    Commands that call no backend pass `secrets_required=False`: the proxy's master key
    need not be set to read a report."""
    try:
        return load_config(path, secrets_required=secrets_required)
    except ConfigError as exc:  # it may quote the file: escapes and bidi controls shown
        raise click.ClickException(printable_lines(exc)) from None


class OutputPath(click.Path):
    """A file the command writes, checked before any work: its folder must exist and be
    writable, so a typo fails at once instead of with a traceback after a long run."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, writable=True, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = Path(os.fsdecode(super().convert(value, param, ctx)))
        folder = path.parent
        if not folder.is_dir():
            self.fail(f"{str(value)!r}: folder {str(folder)!r} does not exist", param, ctx)
        if not os.access(folder, os.W_OK | os.X_OK):
            self.fail(f"{str(value)!r}: folder {str(folder)!r} is not writable", param, ctx)
        return path


def prefer_env(envvar: str) -> str:
    """What every option holding a secret says in --help: the same value from the
    environment stays out of the process list."""
    return f"Prefer setting {envvar}: a command line is visible to every user in `ps`."


def write_output(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all, and 0600 (it may quote recorded prompts):
    see `private_files.private_output`."""
    try:
        write_private(path, text)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None


class BaseURL(click.ParamType[str]):
    """An http(s) URL with a host and a valid port, checked before any request: the HTTP
    clients raise their own exception types (or a traceback) for a malformed one."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value).strip()
        try:
            parts = urlsplit(text)
            port = parts.port  # raises ValueError for a port out of range or not a number
        except ValueError as exc:
            # Neither the URL nor the end of urlsplit's message, which quotes the port as
            # written: both show the password of a URL whose host was left out
            # (`http://user:secret/v1`), where nothing reads as a password to hide.
            problem = str(exc).partition(" as ")[0]
            self.fail(f"not a valid URL: {problem}", param, ctx)
        shown = safe_url(text)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.fail(f"{shown!r} is not an http(s) URL, e.g. http://127.0.0.1:8000/v1", param, ctx)
        if port == 0:
            self.fail(f"{shown!r}: port 0 is not a port to connect to", param, ctx)
        return text


class UsageFailure(click.UsageError):
    """A usage error that exits 1, for a command whose exit 2 reports a finding."""

    exit_code = 1


class FindingCommand(click.Command):
    """A command whose exit 2 means it found something (cache busters, changes to make), so
    its usage errors exit 1 rather than click's 2: a script can tell the two apart."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise UsageFailure(exc.message, exc.ctx) from None
