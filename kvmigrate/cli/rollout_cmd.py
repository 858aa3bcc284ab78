"""`kvmigrate rollout` and `kvmigrate rollback`: change and inspect the rollout."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
import msgspec
from click.core import ParameterSource

from kvmigrate.cli.options import FiniteRange, config_option, load_or_exit, prefer_env
from kvmigrate.logtext import printable_lines
from kvmigrate.policies import Mode
from kvmigrate.policies.gates import GateResult, gate_summary, gates_off, render_gates
from kvmigrate.policies.modes import SWITCHABLE
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.rollout.auto import AutoSettings, auto_rollout
from kvmigrate.rollout.client import EndpointMissing, LocalRollout, RemoteRollout, RolloutClient
from kvmigrate.rollout.controller import (
    OBSERVE_REFUSAL,
    REASON_MAX_CHARS,
    GatesRefused,
    RolloutError,
    RolloutStatus,
)
from kvmigrate.rollout.status_table import render_status_table
from kvmigrate.rollout.store import StoreError, UnreadableState


@dataclass(frozen=True, slots=True)
class Target:
    """Where a command goes (the store from the config, or a running proxy), which cohort
    it is about, and how it answers: what `target_options` gives every command."""

    config_path: str
    proxy_url: str | None
    admin_key: str | None
    as_json: bool
    model: str | None
    cohort_name: str | None

    @property
    def cohort(self) -> str | None:
        """The cohort `--model` or `--cohort` names (None: the config's only one)."""
        if self.model is not None and self.cohort_name is not None:
            raise click.UsageError("give --model or --cohort, not both")
        return self.model if self.model is not None else self.cohort_name

    @contextmanager
    def client(self, candidate: str | None = None) -> Iterator[RolloutClient]:
        """The client, bound to the selected cohort, with every refusal turned into a
        one-line error and a non-zero exit."""
        name = self.cohort
        try:
            if self.proxy_url:
                yield RemoteRollout(
                    self.proxy_url, self.admin_key, cohort=name, candidate=candidate
                )
                return
            # The store and the records only: the backends' secrets need not be set.
            config = load_or_exit(self.config_path, secrets_required=False)
            if self.model is not None and config.route(self.model) is None:
                known = ", ".join(m.model_name for m in config.models)
                raise click.ClickException(
                    printable_lines(f"no model {self.model!r} in the config; models: {known}")
                )
            controller = open_controller(config)
            try:
                yield LocalRollout(controller, cohort=name, candidate=candidate)
            finally:
                controller.store.close()
        except GatesRefused as refused:
            _echo(render_gates([g.to_dict() for g in refused.results]), err=True)
            raise click.ClickException(printable_lines(refused)) from None
        except (RolloutError, StoreError, UnreadableState) as exc:
            raise click.ClickException(printable_lines(exc)) from None


def target_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options every rollout command shares (`--config`, `--proxy-url`, `--admin-key`,
    `--json`, `--model`, `--cohort`), handed to the command as one `target: Target`."""

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        fields = {name: kwargs.pop(name) for name in Target.__dataclass_fields__}
        return func(*args, target=Target(**fields), **kwargs)

    # functools.wraps carried over the options declared below this decorator, so the
    # order of the options in --help is the same as before.
    wrapped: Callable[..., Any] = click.option(
        "--cohort",
        "cohort_name",
        metavar="NAME",
        help="A cohort named in the config's cohorts: section.",
    )(command)
    wrapped = click.option(
        "--model",
        metavar="MODEL",
        help="The cohort of a model's traffic (its models[].model_name) that no named "
        "cohort matched. A config of several cohorts needs --model or --cohort.",
    )(wrapped)
    wrapped = click.option("--json", "as_json", is_flag=True, help="Print JSON.")(wrapped)
    wrapped = click.option(
        "--admin-key",
        envvar="KVMIGRATE_ADMIN_KEY",
        help="The proxy's server.admin_key. " + prefer_env("KVMIGRATE_ADMIN_KEY"),
    )(wrapped)
    wrapped = click.option(
        "--proxy-url",
        help="Change a running proxy through its /admin API instead of writing the store directly.",
    )(wrapped)
    return config_option(wrapped)


def _no_minus_zero(
    _ctx: click.Context, _param: click.Parameter, value: float | None
) -> float | None:
    """-0 would be recorded as "-0%" (FiniteRange refuses NaN, which JSON would carry to a
    proxy as null)."""
    return 0.0 if value == 0 else value


def _bounded_reason(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """Refused here, before a store or a proxy is reached: the history keeps every reason."""
    if len(value) > REASON_MAX_CHARS:
        raise click.BadParameter(f"at most {REASON_MAX_CHARS} characters (got {len(value)})")
    return value


def _refuse_options_before(ctx: click.Context) -> None:
    """The group's own options given before a subcommand: each subcommand takes its own
    (`rollout status --config X`), so these would be dropped unseen (a `rollout --config
    prod.yaml auto` walked ./config.yaml)."""
    given = [
        param.opts[0]
        for param in ctx.command.params
        if param.name and ctx.get_parameter_source(param.name) == ParameterSource.COMMANDLINE
    ]
    if given:
        raise click.UsageError(
            f"{', '.join(given)} before `{ctx.invoked_subcommand}` would be ignored: give "
            f"options after the subcommand (kvmigrate rollout {ctx.invoked_subcommand} "
            f"{given[0]} ...)"
        )


@click.group("rollout", invoke_without_command=True)
@click.option(
    "--percent",
    type=FiniteRange(0, 100),
    callback=_no_minus_zero,
    help="Give the candidate N% of conversations (split mode).",
)
@click.option(
    "--mode", type=click.Choice([mode.value for mode in SWITCHABLE]), help="Switch the mode."
)
@click.option(
    "--reason",
    default="",
    callback=_bounded_reason,
    help="Why: kept in the rollout history.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Promote even when gates refuse (recorded); a split of a share kept in shadow mode "
    "is a promotion too.",
)
@click.option(
    "--candidate",
    metavar="BACKEND",
    help="With --percent: which of the model's candidates gets the share (one at a time).",
)
@target_options
@click.pass_context
def rollout(
    ctx: click.Context,
    percent: float | None,
    mode: Mode | None,
    reason: str,
    force: bool,
    candidate: str | None,
    target: Target,
) -> None:
    """Change the rollout: `kvmigrate rollout --percent 50`. Raising the percent is a
    promotion, checked by the gates over recorded traffic. Running proxies apply any change
    within a second. A config of several cohorts needs `--model gpt-4o-mini` or
    `--cohort NAME`. The subcommands take their options after their name."""
    if ctx.invoked_subcommand is not None:
        _refuse_options_before(ctx)
        return
    if percent is None and mode is None:
        raise click.UsageError("give --percent N or --mode shadow|split, or a subcommand")
    if candidate is not None and percent is None:
        raise click.UsageError("--candidate goes with --percent N")
    with target.client(candidate) as client:
        outcome = client.change(percent, Mode(mode) if mode else None, reason, force)
    if target.as_json:
        _echo_json(outcome)
        return
    event = outcome.event
    if not outcome.changed:
        _echo(
            (f"rollout of {event.cohort}: " if event.cohort else "rollout: ")
            + f"already {event.to_mode} {event.to_percent:g}% (version {event.version}); "
            "nothing changed"
        )
        return
    _echo(
        (f"rollout of {event.cohort}: " if event.cohort else "rollout: ")
        + f"{event.from_mode} {event.from_percent:g}% -> "
        f"{event.to_mode} {event.to_percent:g}% (version {event.version})"
        + (" [forced past the gates]" if event.forced else "")
    )
    if outcome.gates:
        _echo(render_gates([g.to_dict() for g in outcome.gates]))


@rollout.command("status")
@target_options
def status(target: Target) -> None:
    """Where the rollout stands, and what the next step's gates say.

    One cohort's in detail, or, on a config of several cohorts and none named, a table of
    them all: mode, percent, candidate, last change, and the next step's gates."""
    with target.client() as client:
        reports = [client.status()] if target.cohort is not None else _statuses(client)
    if len(reports) > 1:
        if target.as_json:
            _echo_json(reports)
        else:
            _echo(render_status_table(reports))
        return
    report = reports[0]
    if target.as_json:
        _echo_json(report)
        return
    state = report.state
    if report.cohort:
        _echo(f"cohort {report.cohort} (candidate {report.candidate})")
    _echo(
        f"mode {state.mode}, candidate share {state.percent:g}%, "
        f"version {state.version}, last good {state.last_good_percent:g}%"
    )
    _echo(f"changed {_when(state.updated_at)} by {state.updated_by or '-'}")
    if state.mode == Mode.OBSERVE:
        # No candidate: no step to take, and no gate to wait on.
        _echo(OBSERVE_REFUSAL + ".")
        return
    _echo(
        f"steps {', '.join(f'{s:g}' for s in report.steps)}; next: "
        + (f"{report.next_step:g}%" if report.next_step else "none (complete)")
    )
    if len(report.candidates) > 1:
        _echo_candidates(report)
    elif report.gates_for_next_step:
        _echo(_every_gate(report.gates_for_next_step))


@rollout.command("history", short_help="Every change: when, who, why, and the gates' verdicts.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@target_options
def history(limit: int, target: Target) -> None:
    """Every change: when, who, from what to what, why, and the gates' verdicts. Every
    cohort's, or with --model/--cohort one cohort's (with the fleet-wide changes it
    followed)."""
    with target.client() as client:
        events = client.history(limit)
    if target.as_json:
        _echo_json(events)
        return
    if not events:
        _echo("no changes recorded yet")
    for e in events:
        gates = gate_summary(e.gates)
        _echo(
            f"v{e.version:<4} {_when(e.at)}  {e.cohort or '(fleet)':<14} {e.action:<13} "
            f"{e.from_mode} {e.from_percent:g}% -> {e.to_mode} "
            f"{e.to_percent:g}%  by {e.actor}"
            + (f" on {e.candidate}" if e.candidate else "")
            + (" FORCED" if e.forced else "")
            + (f"  reason: {e.reason}" if e.reason else "")
            + (f"  gates: {gates}" if gates else "")
        )


@rollout.command("auto", short_help="Walk rollout.steps through the gates, baking at each step.")
@click.option(
    "--bake",
    type=float,
    default=None,
    help="Seconds to bake at each step [default: rollout.bake_seconds].",
)
@click.option(
    "--step-timeout",
    type=float,
    default=3600.0,
    show_default=True,
    help="Give up when a step's evidence stays inconclusive this long.",
)
@click.option("--poll", type=float, default=5.0, show_default=True)
@click.option("--candidate", metavar="BACKEND", help="Which of the model's candidates to promote.")
@target_options
def auto(
    bake: float | None,
    step_timeout: float,
    poll: float,
    candidate: str | None,
    target: Target,
) -> None:
    """Walk the cohort's steps (rollout.steps, e.g. 10, 50, 100) with a bake time each;
    exit non-zero when a gate fails or the cohort is rolled back meanwhile."""
    if bake is None:
        config = load_or_exit(target.config_path, secrets_required=False)
        named = config.cohort(target.cohort_name) if target.cohort_name else None
        bake = named.bake_seconds if named and named.bake_seconds is not None else None
        bake = config.rollout.bake_seconds if bake is None else bake
    settings = AutoSettings(bake, step_timeout, poll)
    with target.client(candidate) as client:
        result = auto_rollout(client, settings, echo=lambda m: _echo(m, err=target.as_json))
    if target.as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))  # JSON escapes every control
    else:
        _echo(result.message)
    if not result.completed:
        raise SystemExit(1)


@click.command("rollback")
@click.option(
    "--reason",
    default="",
    callback=_bounded_reason,
    help="Why: kept in the rollout history.",
)
@target_options
def rollback(reason: str, target: Target) -> None:
    """Back to the last step whose gates passed, or to 0%.

    Only the selected cohort moves; the others keep their share."""
    with target.client() as client:
        outcome = client.rollback(reason)
    if target.as_json:
        _echo_json(outcome)
        return
    event = outcome.event
    _echo(
        f"rolled back: {event.from_percent:g}% -> {event.to_percent:g}% (version {event.version})"
    )


def _echo_candidates(report: RolloutStatus) -> None:
    """Each candidate's gates on its own traffic, then each pair compared."""
    for candidate in report.candidates:
        chosen = " (selected: a split serves it)" if candidate.serving else ""
        _echo(f"candidate {candidate.backend}{chosen}:")
        if candidate.gates:
            _echo(_every_gate(candidate.gates))
    _echo("candidates compared (A - B):")
    for d in report.comparisons:
        _echo(f"  {d.measure:<10}  {d.detail}")


def _every_gate(results: list[GateResult]) -> str:
    """The gates that ran, then those the config leaves off, each on its line."""
    shown = [g.to_dict() for g in results]
    return render_gates(shown + gates_off(shown))


def _statuses(client: RolloutClient) -> list[RolloutStatus]:
    """Every cohort's status; from a proxy older than cohorts (no /admin/rollout/cohorts),
    its one status, said so."""
    try:
        return client.statuses()
    except EndpointMissing as missing:
        _echo(
            f"note: {missing}: the proxy predates cohorts; showing its one rollout's status",
            err=True,
        )
        return [client.status()]


def _echo(text: object, err: bool = False) -> None:
    """Text for the terminal: cohort names, reasons and actors come from a config, a store
    or an admin API client, and may hold terminal escapes or bidi controls."""
    click.echo(printable_lines(text), err=err)


def _echo_json(value: object) -> None:
    """The answer as the admin API sends it (`--json` is the same either way)."""
    click.echo(json.dumps(msgspec.to_builtins(value), indent=2))  # escapes every control


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"
