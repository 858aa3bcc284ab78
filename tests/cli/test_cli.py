"""The CLI as a user runs it: real processes, the README's commands, no tracebacks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from kvmigrate.serving import free_port

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "the README must open with a bash block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_two_commands_and_ci_runs_the_second() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    install_and_run, install_and_test = commands
    assert install_and_run.endswith("kvmigrate demo")
    assert install_and_test == "bash scripts/test.sh"
    assert "pytest" in (ROOT / "scripts" / "test.sh").read_text()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.split("#")[0].strip() == install_and_test for line in ci_lines)


def test_cli_reference_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, "docs/cli.md is stale: run python scripts/cli_reference.py"


def test_help_lists_only_working_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "--help"], capture_output=True, text=True, check=True
    ).stdout
    listed = set(re.findall(r"^  (\w+)", out.split("Commands:")[1], re.M))
    assert listed == {
        "config",
        "init",
        "demo",
        "emulate",
        "proxy",
        "rollout",
        "rollback",
        "rewrite",
        "records",
        "report",
        "cachecheck",
        "parity",
        "bench",
        "plan",
        "doctor",
    }


@pytest.mark.parametrize(
    "args",
    [
        ["proxy", "--config", "/nonexistent.yaml"],
        ["rollout"],
        ["rollout", "--percent", "150", "--config", "config.yaml"],
        ["emulate", "--profile", "gpt"],
        ["emulate", "--profile", "vllm", "--port", "notaport"],
    ],
)
def test_bad_invocations_exit_nonzero_without_traceback(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvmigrate", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip()


@pytest.fixture
def emulated_proxy() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvmigrate", "proxy", "--emulated", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert f"kvmigrate proxy on http://127.0.0.1:{port}/v1" in banner
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0


def test_first_readme_command_serves_the_emulated_setup(emulated_proxy: str) -> None:
    with openai.OpenAI(base_url=emulated_proxy, api_key="sk-anything", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert raw.headers["x-kvmigrate-backend"] == "hosted"
        assert raw.parse().choices[0].message.content

    deadline = time.monotonic() + 10
    text = ""
    while 'role="shadow"' not in text and time.monotonic() < deadline:
        time.sleep(0.1)
        text = (
            urllib.request.urlopen(emulated_proxy.removesuffix("/v1") + "/metrics").read().decode()
        )
    assert 'kvmigrate_requests_total{backend="vllm",cohort="gpt-4o-mini",role="shadow"' in text


@pytest.mark.parametrize(
    "args",
    [
        ["parity", "--min-score", "nan"],
        ["plan", "--gpu-hour-price", "nan"],
        ["plan", "--weights-gb", "inf"],
        ["report", "--input-price", "nan"],
        ["rollout", "--percent", "nan"],
    ],
)
def test_every_float_option_refuses_nan_and_infinity(args: list[str]) -> None:
    """NaN compares false to both of click.FloatRange's bounds: it passed every range."""
    proc = subprocess.run(
        [sys.executable, "-m", "kvmigrate", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert "is not a finite number" in proc.stderr
