"""`kvmigrate proxy` (one process, or `--workers 2`) whose workers cannot start (the rollout store cannot be
opened) must stop with a one-line reason and a non-zero exit: not claim to serve while it
restarts crashing workers forever, each with a traceback.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_support import refused_port

from kvmigrate.serving import free_port


def _config(tmp: Path, port: int, state: str) -> Path:
    """A proxy whose backends refuse connections: these tests end before any request."""
    config = tmp / "config.yaml"
    config.write_text(f"""
server: {{host: 127.0.0.1, port: {port}}}
backends:
  hosted: {{api_base: "http://127.0.0.1:{refused_port()}/v1"}}
  vllm: {{api_base: "http://127.0.0.1:{refused_port()}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: "meta-llama/Llama-3.1-8B-Instruct"}}
rollout: {{mode: shadow, state: "{state}"}}
record: {{db: "sqlite:///{tmp}/records.db"}}
""")
    return config


@pytest.mark.parametrize("workers", [1, 2])
def test_pool_whose_workers_cannot_open_the_rollout_store_exits_with_the_reason(
    tmp_path: Path, workers: int
) -> None:
    # A SQLite store under a regular file: its folder can never be made (this works as
    # root too, where a read-only folder would not stop SQLite).
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    config = _config(tmp_path, free_port(), f"sqlite:///{blocker}/state.db")
    command = [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(config)]
    try:
        done = subprocess.run(
            [*command, "--workers", str(workers)], capture_output=True, text=True, timeout=90
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the pool kept running: {exc.stdout!r} {exc.stderr!r}") from None
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Traceback" not in out, out
    assert "kvmigrate proxy on" not in done.stdout, "the banner says it serves"
    assert "cannot open rollout store" in done.stderr, out


def test_a_second_pool_on_a_port_in_use_is_refused(tmp_path: Path) -> None:
    """The workers bind with SO_REUSEPORT: a second pool on the same port (same user) bound
    too and silently took half the connections. A single proxy gets EADDRINUSE; so does it."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = _config(tmp_path, port, f"sqlite:///{tmp_path}/state.db")
        command = [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(config)]
        done = subprocess.run(
            [*command, "--workers", "2"], capture_output=True, text=True, timeout=90
        )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Traceback" not in out, out
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr, out
