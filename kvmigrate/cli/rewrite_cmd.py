"""`kvmigrate rewrite`: point client code and deployment configs at the proxy."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from kvmigrate.cli.options import FindingCommand, UsageFailure, config_option, prefer_env
from kvmigrate.config import ConfigError, load_config
from kvmigrate.config.loader import DEFAULT_CONFIG_PATH
from kvmigrate.migrate import (
    DEFAULT_PROXY_URL,
    ApplyError,
    DirtyTree,
    RevertError,
    RewriteOptions,
    apply_plan,
    build_plan,
    plan_json,
    plan_text,
    proxy_url_for_server,
    revert,
    revert_json,
    revert_text,
    validate_proxy_key,
    validate_proxy_url,
)
from kvmigrate.migrate.gitstate import dirty_paths
from kvmigrate.migrate.report import for_terminal

EXIT_NOTHING, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2


class _AnyEnv(Mapping[str, str]):
    """The environment, with a stand-in for unset secrets: rewrite reads only `server`."""

    def __getitem__(self, name: str) -> str:
        return os.environ.get(name) or "unset-while-rewriting"

    def __iter__(self) -> Iterator[str]:
        return iter(os.environ)

    def __len__(self) -> int:
        return len(os.environ)


@click.command("rewrite", cls=FindingCommand, context_settings={"max_content_width": 100})
@click.argument("path", default=".", type=click.Path(exists=True, file_okay=False))
@click.option("--apply", "do_apply", is_flag=True, help="Write the changes (backed up first).")
@click.option(
    "--revert",
    "revert_id",
    is_flag=False,
    flag_value="latest",
    default=None,
    metavar="[ID]",
    help="Restore the files of backup ID (default: your latest). Put PATH before it.",
)
@click.option("--proxy-url", help="URL clients should use [default: from --config, else "
              f"{DEFAULT_PROXY_URL}]; Anthropic's SDKs and ANTHROPIC_BASE_URL get it "
              "without its /v1.")  # fmt: skip
@click.option(
    "--proxy-key",
    envvar="KVMIGRATE_PROXY_KEY",
    help="Also rewrite literal OPENAI_API_KEY (and ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN) "
    "values in .env and deployment files to this key. Off unless given. "
    + prefer_env("KVMIGRATE_PROXY_KEY"),
)
@click.option("--allow-dirty", is_flag=True, help="Apply even with uncommitted git changes.")
@click.option(
    "--backup-dir",
    type=click.Path(file_okay=False),
    help="Keep backups here, outside the tree [default: PATH/.kvmigrate/backups, which "
    "ignores itself in git]. Give it to --revert too.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable report.")
@config_option
@click.pass_context
def rewrite(
    ctx: click.Context,
    path: str,
    do_apply: bool,
    revert_id: str | None,
    proxy_url: str | None,
    proxy_key: str | None,
    allow_dirty: bool,
    backup_dir: str | None,
    as_json: bool,
    config_path: str,
) -> None:
    """Point OpenAI-compatible client code and deployment configs under PATH at the proxy.

    Python (OpenAI, LangChain, LlamaIndex, LiteLLM, DSPy, AutoGen, CrewAI, Instructor),
    JS/TS (openai, Vercel AI SDK, LangChain JS), .env files, docker-compose, Kubernetes,
    Helm values, GitHub Actions and LiteLLM proxy configs. A dry run (the default) prints
    a diff and a summary; Azure and Bedrock clients and URLs built at run time are listed,
    never rewritten.

    \b
    Backups hold the files as they were, secrets in .env files included: they go to
    PATH/.kvmigrate/backups (0700, with a .gitignore so `git add -A` skips them), or to
    --backup-dir. Each is sealed with a key of yours outside the tree
    ($XDG_STATE_HOME/kvmigrate, else ~/.local/state/kvmigrate): --revert restores only
    backups sealed for you, and never writes outside PATH.

    \b
    Exit codes:
      0  nothing to rewrite; or --apply / --revert succeeded
      1  errors: a file could not be read or parsed (others are still handled),
         a refused or failed apply, a failed revert, a bad option
      2  dry run: changes are proposed
    """
    backups = Path(backup_dir).resolve() if backup_dir else None
    if revert_id is not None:
        if do_apply:
            raise UsageFailure("--apply and --revert do not go together")
        ctx.exit(
            _revert(Path(path), None if revert_id == "latest" else revert_id, as_json, backups)
        )
    if do_apply and not allow_dirty and (dirty := dirty_paths(Path(path).resolve())):
        # Refuse before any output: a diff and "Dry run" above the error read as a success.
        ctx.exit(_refuse(str(DirtyTree(dirty)), as_json))
    try:
        url = validate_proxy_url(proxy_url) if proxy_url else _config_url(ctx, config_path)
        key = validate_proxy_key(proxy_key) if proxy_key is not None else None
    except ValueError as exc:
        raise UsageFailure(str(exc)) from None
    plan = build_plan(Path(path), RewriteOptions(url, key))
    applied, error = None, None
    if do_apply:
        try:
            applied = apply_plan(plan, allow_dirty=allow_dirty, backup_dir=backups)
        except ApplyError as exc:
            error = str(exc)
    code = _exit_code(bool(plan.changes), bool(plan.errors) or error is not None, do_apply)
    if as_json:
        mode = "apply" if do_apply else "dry-run"
        _echo_json(plan_json(plan, mode=mode, exit_code=code, applied=applied, error=error))
    else:
        command = None if do_apply else _apply_command(ctx, path)
        click.echo(
            plan_text(
                plan,
                applied=applied,
                show_diff=not do_apply or error is not None,
                apply_command=command,
                backup_dir=backups,
            )
        )
        if error:
            click.echo(for_terminal(f"Error: {error}"), err=True)
    ctx.exit(code)


def _refuse(error: str, as_json: bool) -> int:
    if as_json:
        _echo_json({"version": 1, "mode": "apply", "error": error, "exit_code": EXIT_ERROR})
    else:
        click.echo(for_terminal(f"Error: {error}"), err=True)
    return EXIT_ERROR


def _apply_command(ctx: click.Context, path: str) -> str:
    """The dry run's own command with --apply: the options that shaped the diff, exactly.
    A --proxy-key given on the command line is never printed, nor put back on one (where
    `ps` shows it): the command reads it from KVMIGRATE_PROXY_KEY, which it says to set."""
    words = ["kvmigrate", "rewrite", path]
    given = {
        name
        for name in ("proxy_url", "config_path", "backup_dir", "allow_dirty", "proxy_key")
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    }
    flags = (
        ("proxy_url", "--proxy-url"),
        ("config_path", "--config"),
        ("backup_dir", "--backup-dir"),
    )
    for name, flag in flags:
        if name in given:
            words += [flag, str(ctx.params[name])]
    parts = [shlex.quote(w) for w in words]
    if "allow_dirty" in given:
        parts.append("--allow-dirty")
    command = " ".join([*parts, "--apply"])
    if "proxy_key" in given:
        return f"{command} (with KVMIGRATE_PROXY_KEY set to the key)"
    return command


def _exit_code(changes: bool, errors: bool, applied: bool) -> int:
    if errors:
        return EXIT_ERROR
    return EXIT_CHANGES if changes and not applied else EXIT_NOTHING


def _config_url(ctx: click.Context, config_path: str) -> str:
    implicit = ctx.get_parameter_source("config_path") is ParameterSource.DEFAULT
    if implicit and config_path == DEFAULT_CONFIG_PATH and not Path(config_path).exists():
        return DEFAULT_PROXY_URL
    try:
        server = load_config(config_path, env=_AnyEnv()).server
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    return proxy_url_for_server(server.host, server.port)


def _revert(root: Path, backup_id: str | None, as_json: bool, backup_dir: Path | None) -> int:
    try:
        result = revert(root, backup_id, backup_dir=backup_dir)
    except (RevertError, OSError) as exc:
        if as_json:
            _echo_json(revert_json(None, error=str(exc), exit_code=EXIT_ERROR))
        else:
            click.echo(for_terminal(f"Error: {exc}"), err=True)
        return EXIT_ERROR
    if as_json:
        _echo_json(revert_json(result, error=None, exit_code=EXIT_NOTHING))
    else:
        click.echo(revert_text(result))
    return EXIT_NOTHING


def _echo_json(data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, indent=2))
