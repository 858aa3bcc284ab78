"""`kvmigrate proxy`: serve the OpenAI-compatible proxy."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass

import click

from kvmigrate.cli.options import FiniteRange, config_option, load_or_exit
from kvmigrate.config import Config, safe_url
from kvmigrate.config.access import describe_auth
from kvmigrate.embedded import (
    EMBEDDED_ADMIN_KEY,
    HOSTED_MODEL,
    embedded_config,
    emulated_backends,
)
from kvmigrate.litellm_bridge.gateway import LiteLLMNotInstalled, litellm_problem
from kvmigrate.proxy.pool import default_workers, serve_pool
from kvmigrate.rollout.store import StoreError
from kvmigrate.runtime import build_app
from kvmigrate.serving import DRAIN_S, run_app_forever

# Reasons the operator must act on, said in one line: LiteLLM that does not import, a store
# that cannot be opened.
REFUSALS: tuple[type[Exception], ...] = (LiteLLMNotInstalled, StoreError)


@click.command("proxy")
@config_option
@click.option("--host", default=None, help="Override server.host.")
@click.option("--port", type=int, default=None, help="Override server.port.")
@click.option(
    "--emulated",
    is_flag=True,
    help="Ignore --config: start an emulated hosted API and an emulated vLLM in this "
    "process and proxy to them in shadow mode (no GPU, no keys).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Proxy processes on the one port (SO_REUSEPORT), metrics summed across them. "
    "Default: the cores this process may use (CPU affinity and cgroup quota); 1 with "
    "--emulated. 1 serves from this process, as before.",
)
@click.option(
    "--drain-seconds",
    type=FiniteRange(min=0),
    default=DRAIN_S,
    show_default=True,
    help="On SIGTERM or Ctrl-C: how long requests and streams in flight may take to finish "
    "(set it under your orchestrator's grace period, e.g. Kubernetes' 30 s). A second "
    "SIGTERM or Ctrl-C ends them at once.",
)
@click.option(
    "--log-level",
    default="warning",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def proxy(
    config_path: str,
    host: str | None,
    port: int | None,
    emulated: bool,
    workers: int | None,
    drain_seconds: float,
    log_level: str,
) -> None:
    """Serve the proxy: point OPENAI_BASE_URL at http://HOST:PORT/v1."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if emulated:
        with (
            emulated_backends() as backends,
            tempfile.TemporaryDirectory(prefix="kvmigrate-emulated-") as state_dir,
        ):
            config = embedded_config(
                backends, host or "127.0.0.1", 4000 if port is None else port, state_dir=state_dir
            )
            pool = Pool(workers or 1, drain_seconds, log_level)
            _serve(config, host, port, emulated=True, pool=pool)
        return
    pool = Pool(workers or default_workers(), drain_seconds, log_level)
    _serve(load_or_exit(config_path), host, port, emulated=False, pool=pool)


@dataclass(frozen=True)
class Pool:
    """How many processes serve, how long they drain at shutdown, and their log level."""

    workers: int
    drain_s: float
    level: str


def _serve(config: Config, host: str | None, port: int | None, emulated: bool, pool: Pool) -> None:
    host = host or config.server.host
    port = config.server.port if port is None else port
    r = config.rollout
    lines = [
        f"kvmigrate proxy on http://{host}:{port}/v1 "
        f"(primary {r.primary}, candidate {r.candidate or 'none'}, mode {r.mode}, "
        f"percent {r.percent:g}, shadow_sample {r.shadow_sample:g})",
        "  " + describe_auth(config),
    ]
    if emulated:
        lines += [
            f"  hosted (emulated): {config.primary.api_base}",
            f"  vllm   (emulated): {config.candidate.api_base}",
            "  try it:",
            f"    export OPENAI_BASE_URL=http://{host}:{port}/v1 OPENAI_API_KEY=sk-anything",
            f"    curl -s $OPENAI_BASE_URL/chat/completions -H 'Content-Type: application/json' "
            f'-d \'{{"model": "{HOSTED_MODEL}", "messages": '
            f'[{{"role": "user", "content": "hello"}}]}}\'',
            f"    curl -s http://{host}:{port}/metrics | grep kvmigrate_requests",
            f"    KVMIGRATE_ADMIN_KEY={EMBEDDED_ADMIN_KEY} kvmigrate rollout status "
            f"--proxy-url http://{host}:{port}",
            f"  state and records (removed at exit): {safe_url(config.rollout.state)}",
        ]
    problem = litellm_problem(config)
    if problem:  # before any store opens
        raise click.ClickException(problem)
    banner = "\n".join(lines)
    if pool.workers > 1:
        serve_pool(
            config,
            host,
            port,
            pool.workers,
            banner,
            pool.level,
            pool.drain_s,
            build=build_app,
            refusals=REFUSALS,
        )
        return
    try:
        app = build_app(config)
    except REFUSALS as exc:
        raise click.ClickException(str(exc)) from None
    run_app_forever(app, host, port, banner, pool.drain_s)
