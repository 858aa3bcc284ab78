"""The CLI loads a command's code only when that command runs, and --help says the same as
it would with every command loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from kvmigrate.cli import COMMANDS, main
from kvmigrate.cli.lazy import load_command

# What the subcommands pull in; listing them must import none of it.
HEAVY = ("openai", "libcst", "aiohttp", "yaml", "jsonschema", "kvmigrate.config")
# Imported in a fresh interpreter: what is loaded once `argv` has run.
PROBE = """
import json, sys
from kvmigrate.cli import main
main(sys.argv[1:], standalone_mode=False)
print(json.dumps(sorted(sys.modules)))
"""


def modules_after(*argv: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def loaded(modules: set[str], roots: tuple[str, ...]) -> set[str]:
    return {m for m in modules if any(m == r or m.startswith(r + ".") for r in roots)}


def test_help_imports_no_command_module_nor_their_dependencies() -> None:
    modules = modules_after("--help")
    assert loaded(modules, HEAVY) == set()
    command_modules = {c.target.partition(":")[0] for c in COMMANDS.values()}
    assert modules & command_modules == set()


def test_running_a_command_imports_only_its_own_module() -> None:
    modules = modules_after("config", "--help")
    assert "kvmigrate.cli.config_cmd" in modules
    assert loaded(modules, ("kvmigrate.cli.bench_cmd", "kvmigrate.cli.rewrite_cmd")) == set()


def test_rollout_status_on_a_sqlite_store_loads_no_proxy_nor_http_client(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
backends:
  hosted: {{api_base: http://127.0.0.1:9/v1}}
  vllm: {{api_base: http://127.0.0.1:9/v1}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout:
  state: sqlite:///{tmp_path}/state.db
record:
  db: sqlite:///{tmp_path}/records.db
"""
    )
    modules = modules_after("rollout", "status", "--json", "--config", str(config))
    assert "kvmigrate.rollout.controller" in modules
    assert loaded(modules, ("aiohttp", "openai", "libcst", "kvmigrate.proxy")) == set()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_summary_is_its_command_s_own_first_sentence(name: str) -> None:
    command = load_command(COMMANDS[name].target)
    assert command.name == name
    stand_in = click.Command(name, help=COMMANDS[name].summary)
    assert stand_in.get_short_help_str(10_000) == command.get_short_help_str(10_000)


@pytest.mark.parametrize("width", [60, 80, 100, 200])
def test_listing_matches_the_one_click_builds_from_the_loaded_commands(width: int) -> None:
    with click.Context(main, info_name="kvmigrate", terminal_width=width) as ctx:
        lazy, eager = ctx.make_formatter(), ctx.make_formatter()
        main.format_commands(ctx, lazy)
        # click's own listing calls get_command for every name, which loads them all.
        click.Group.format_commands(main, ctx, eager)
    assert lazy.getvalue() == eager.getvalue()
    assert lazy.getvalue().count("\n") == len(COMMANDS) + 1


def test_an_unknown_command_is_still_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "nosuch"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "No such command 'nosuch'" in proc.stderr


def test_report_on_a_sqlite_store_loads_no_server_nor_http_client(tmp_path: Path) -> None:
    """A report reads records: the proxy's recorder, the emulator's server and aiohttp
    were a third of its start-up (importing `emulator.tokens` loaded the whole package)."""
    from kvmigrate.recorder.store import open_store

    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
backends:
  hosted: {{api_base: http://127.0.0.1:9/v1}}
  vllm: {{api_base: http://127.0.0.1:9/v1}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout:
  state: sqlite:///{tmp_path}/state.db
record:
  db: sqlite:///{tmp_path}/records.db
"""
    )
    with open_store(f"sqlite:///{tmp_path}/records.db"):
        pass
    modules = modules_after("report", "--since", "all", "--config", str(config))
    assert "kvmigrate.report.build" in modules
    heavy = ("aiohttp", "openai", "kvmigrate.proxy", "kvmigrate.emulator.server")
    assert loaded(modules, heavy) == set()
    assert "kvmigrate.recorder.addon" not in modules
    # The cache-buster check counts tokens with the emulator's tokenizer, once records hold
    # requests: that module alone.
    probe = "import json, sys, kvmigrate.emulator.tokens; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert loaded(set(json.loads(proc.stdout)), heavy) == set(), proc.stderr
