"""`kvmigrate doctor`: check a vLLM endpoint before traffic goes to it, or print a
recommended `vllm serve` command."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import click

from kvmigrate.cli.options import config_option, load_or_exit, prefer_env, with_candidate
from kvmigrate.config import Config
from kvmigrate.doctor import Diagnosis, Endpoint, Expectations, diagnose, hosted_context
from kvmigrate.doctor.report import as_json, text
from kvmigrate.doctor.serve_command import serve_command


@dataclass(frozen=True, slots=True)
class _Plan:
    bases: tuple[str, ...]
    api_key: str | None
    want: Expectations


def _config(ctx: click.Context, path: str) -> Config | None:
    """The config when one was asked for or the default file exists; else None."""
    explicit = ctx.get_parameter_source("config_path") is not click.core.ParameterSource.DEFAULT
    if not explicit and not Path(path).exists():
        return None
    return load_or_exit(path)


def _hosted(config: Config | None, model: str | None) -> tuple[str | None, int | None]:
    """The hosted model a candidate model replaces, and its context window."""
    if config is None:
        return None, None
    candidate, primary = config.rollout.candidate, config.rollout.primary
    for route in config.models:
        if model is None or model in (route.served.get(candidate), route.model_name):
            hosted = route.served.get(primary)
            if hosted is not None:
                return hosted, hosted_context(hosted)
    return None, None


def _plan(
    config: Config | None, base_url: str | None, model: str | None, api_key: str | None,
    hosted_window: int | None,
) -> _Plan:  # fmt: skip
    if base_url:
        bases: tuple[str, ...] = (base_url.rstrip("/"),)
    elif config is not None:
        bases = with_candidate(config, "doctor").candidate.direct_api_bases("doctor")
        key = config.candidate.api_key
        api_key = api_key or (key.reveal() if key is not None else None)
        if model is None:
            served = [r.served[config.candidate.name] for r in config.models
                      if config.candidate.name in r.served]  # fmt: skip
            model = served[0] if served else None
    else:
        raise click.UsageError("give --base-url (or --config with a candidate backend)")
    hosted_model, window = _hosted(config, model)
    return _Plan(bases, api_key, Expectations(model, hosted_model, hosted_window or window))


async def _diagnose_all(plan: _Plan) -> list[Diagnosis]:
    results = []
    for base in plan.bases:
        async with Endpoint(base, plan.api_key) as endpoint:
            results.append(await diagnose(endpoint, plan.want))
    return results


@click.command(context_settings={"show_default": True})
@click.option("--base-url", help="The endpoint, e.g. http://127.0.0.1:8000/v1 "
              "[default: every replica of the config's candidate backend].")  # fmt: skip
@click.option("--model", help="The served model to check [default: the config's, else the "
              "first listed].")  # fmt: skip
@click.option("--api-key", envvar="VLLM_API_KEY", help="Bearer key. " + prefer_env("VLLM_API_KEY"))
@click.option("--hosted-context", type=click.IntRange(min=1),
              help="Context window the engine must match [default: the config's hosted "
              "model's].")  # fmt: skip
@click.option("--json", "as_json_output", is_flag=True, help="Print JSON.")
@click.option(
    "--print-serve-command",
    is_flag=True,
    help="Print a recommended `vllm serve` command for --model on --gpu instead.",
)
@click.option("--gpu", help="GPU for --print-serve-command: H100, H200, A100, L4, L40S, ...")
@click.option("--max-model-len", type=click.IntRange(min=256),
              help="Context for --print-serve-command [default: the hosted model's, else "
              "32768].")  # fmt: skip
@config_option
@click.pass_context
def doctor(
    ctx: click.Context,
    base_url: str | None,
    model: str | None,
    api_key: str | None,
    hosted_context: int | None,
    as_json_output: bool,
    print_serve_command: bool,
    gpu: str | None,
    max_model_len: int | None,
    config_path: str,
) -> None:
    """Check that a vLLM endpoint is ready for the migration; print the fix for each failure.

    \b
    Checks: reachable and the model served; a chat template; prompt-token details;
    prefix caching effective (the same prefix twice); tool calling (tool_choice: auto);
    JSON mode; max model length against the hosted model's context.
    Exits 1 when a required check fails.
    """
    config = _config(ctx, config_path)
    if print_serve_command:
        length, source = max_model_len or hosted_context, None
        if max_model_len:
            source = "from --max-model-len"
        elif hosted_context:
            source = "from --hosted-context"
        _print_serve_command(config, model, gpu, length, source, as_json_output)
        return
    plan = _plan(config, base_url, model, api_key, hosted_context)
    results = asyncio.run(_diagnose_all(plan))
    if as_json_output:
        payload = [as_json(r) for r in results]
        click.echo(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
    else:
        click.echo("\n\n".join(text(r) for r in results))
    if not all(r.ok for r in results):
        ctx.exit(1)


def _print_serve_command(
    config: Config | None,
    model: str | None,
    gpu: str | None,
    length: int | None,
    source: str | None,
    as_json: bool,
) -> None:
    if not model or not gpu:
        raise click.UsageError("--print-serve-command needs --model and --gpu")
    if length is None and config is not None:
        hosted, length = _hosted(config, model)
        source = f"the context window of {hosted}, the hosted model it replaces in {config.source}"
    try:
        command = serve_command(model, gpu, length, source)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None
    if as_json:
        flags = [{"flag": " ".join(f.args), "why": f.why} for f in command.flags]
        click.echo(json.dumps({"argv": command.argv, "flags": flags}, indent=2))
    else:
        click.echo(command.text())
