"""A benchmark killed with SIGTERM stops its vLLM: plan_fidelity runs its engine inside
`exit_on_signals()` and `VllmServer`, which signals the server's whole process group.

vLLM itself is replaced by a stand-in with the same shape (a server answering /health
that starts a child of its own, as vLLM's API server starts its engine and worker), run
through the real `VllmServer` in a real child Python process that the test SIGTERMs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

FAKE_VLLM = """\
import argparse, http.server, os, subprocess, sys
parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
args, _ = parser.parse_known_args()
worker = subprocess.Popen(["sleep", "600"])  # vLLM's engine core and worker
with open(os.environ["FAKE_PIDS"], "w") as out:
    out.write(f"{os.getpid()} {worker.pid}")

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", args.port), Health).serve_forever()
"""

BENCHMARK = """\
import sys, time
from contextlib import nullcontext
from pathlib import Path
from kvmigrate.testbed.unwind import exit_on_signals
from kvmigrate.testbed.vllm_server import VllmServer
guard = exit_on_signals() if sys.argv[2] == "guarded" else nullcontext()
with guard, VllmServer(Path("."), python=Path(sys.argv[1]), stop_grace=2):
    print("ready", flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running, not merely a zombie its parent (or init) has yet to reap."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("mode", "stopped"), [("guarded", True), ("unguarded", False)])
def test_sigterm_stops_the_servers_process_group(tmp_path: Path, mode: str, stopped: bool) -> None:
    """Guarded, the benchmark exits 143 (128 + SIGTERM) and neither the server nor its
    child survives; unguarded (as plan_fidelity was), both outlive it."""
    fake = tmp_path / "fake-vllm"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_VLLM)
    fake.chmod(0o755)
    script = tmp_path / "bench.py"
    script.write_text(textwrap.dedent(BENCHMARK))
    pids_file = tmp_path / "pids"
    env = dict(os.environ, FAKE_PIDS=str(pids_file))
    bench = subprocess.Popen(
        [sys.executable, str(script), str(fake), mode], stdout=subprocess.PIPE, text=True, env=env
    )
    assert bench.stdout is not None
    pids: list[int] = []
    try:
        assert bench.stdout.readline().strip() == "ready"
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(_alive(pid) for pid in pids)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=30) == (143 if stopped else -signal.SIGTERM)
        assert _gone(pids, within_s=5) is stopped
    finally:
        bench.kill()
        bench.wait()
        bench.stdout.close()
        if pids and _alive(pids[0]):
            os.killpg(pids[0], signal.SIGKILL)  # the stand-in leads its own process group
