"""The `kvmigrate` command: thin click commands over library functions."""

from __future__ import annotations

import click

from kvmigrate import __version__
from kvmigrate.cli.lazy import LazyCommand, LazyGroup

# Each command's module is imported only when that command runs; the summary is what
# `kvmigrate --help` lists, and tests/cli/test_cli_lazy.py checks it against the docstring.
COMMANDS = {
    "bench": LazyCommand(
        "kvmigrate.cli.bench_cmd:bench",
        "Measure TTFT per turn of multi-turn conversations that resend their whole history.",
    ),
    "cachecheck": LazyCommand(
        "kvmigrate.cli.cachecheck_cmd:cachecheck",
        "Find what in a team's prompts defeats prefix caching.",
    ),
    "config": LazyCommand(
        "kvmigrate.cli.config_cmd:config_group", "Inspect and validate the config file."
    ),
    "demo": LazyCommand(
        "kvmigrate.cli.demo_cmd:demo",
        "Shadow agent traffic to an emulated vLLM, report, and roll out 10% -> 50% -> 100%"
        " through the gates, all on this machine.",
    ),
    "doctor": LazyCommand(
        "kvmigrate.cli.doctor_cmd:doctor",
        "Check that a vLLM endpoint is ready for the migration; print the fix for each failure.",
    ),
    "emulate": LazyCommand(
        "kvmigrate.cli.emulate:emulate",
        "Serve an emulated backend: OpenAI's hosted API, vLLM, or Anthropic's API.",
    ),
    "init": LazyCommand(
        "kvmigrate.cli.init_cmd:init",
        "Write a commented config.yaml for your hosted API and your vLLM: the example config"
        " with your URLs and model names, every other key with its default and its comment.",
    ),
    "parity": LazyCommand(
        "kvmigrate.cli.parity_cmd:parity",
        "Replay requests against the primary and the candidate and report parity beyond noise.",
    ),
    "plan": LazyCommand(
        "kvmigrate.cli.plan_cmd:plan",
        "Size a vLLM fleet for the recorded traffic: TTFT, prefix-cache hits and cost per"
        " fleet size, from a simulation.",
    ),
    "proxy": LazyCommand(
        "kvmigrate.cli.proxy_cmd:proxy",
        "Serve the proxy: point OPENAI_BASE_URL at http://HOST:PORT/v1.",
    ),
    "records": LazyCommand(
        "kvmigrate.cli.records_cmd:records_group", "Maintain the records database."
    ),
    "report": LazyCommand(
        "kvmigrate.cli.report_cmd:report",
        "Summarise recorded traffic: scorecard, TTFT and decode speed by turn, cache, cost.",
    ),
    "rewrite": LazyCommand(
        "kvmigrate.cli.rewrite_cmd:rewrite",
        "Point OpenAI-compatible client code and deployment configs under PATH at the proxy.",
    ),
    "rollback": LazyCommand(
        "kvmigrate.cli.rollout_cmd:rollback",
        "Back to the last step whose gates passed, or to 0%.",
    ),
    "rollout": LazyCommand(
        "kvmigrate.cli.rollout_cmd:rollout",
        "Change the rollout: `kvmigrate rollout --percent 50`.",
    ),
}


class _Group(LazyGroup):
    """Library errors that are the user's to fix become a one-line message and exit 1."""

    def invoke(self, ctx: click.Context) -> object:
        # Imported here, not at the top, so that `kvmigrate --help` loads no config code.
        from kvmigrate.config import NotDirect

        try:
            return super().invoke(ctx)
        except NotDirect as exc:
            raise click.ClickException(str(exc)) from None


@click.group(
    cls=_Group,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="kvmigrate")
def main() -> None:
    """Move LLM agent traffic from a hosted API to self-hosted vLLM, one measured step at a time."""
