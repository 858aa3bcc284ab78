"""scripts/playbook.sh, as the README promises it: the whole table on a fresh clone, exit 0,
and nothing it started left running or listening afterwards, whether it ends or is
interrupted (it once left 12 processes behind, two emulators and the proxy with its
workers, still listening).

The runs here skip the two demos (tests/demo/test_demo.py runs them) and take looser gates and a
smaller pilot (PLAYBOOK_GATES, PLAYBOOK_CONVERSATIONS) so that they fit the suite: about
80 s on a quiet 2-core machine. `bash scripts/playbook.sh` with no variables runs the
demos and config.yaml's gates, and sends the traffic they ask for."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.playbook

REPO = Path(__file__).resolve().parents[2]
QUICK = {
    "PLAYBOOK_PYTHON": sys.executable,
    "PLAYBOOK_SKIP_DEMOS": "1",
    "PLAYBOOK_CONVERSATIONS": "30",
    "PLAYBOOK_GATES": "error_rate_margin=0.1 min_parity=0.8",
}
RUN_BOUND_S = 540


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    # TMPDIR: the script's work directory (mktemp) lands under tmp_path, which is how the
    # processes it started are recognised afterwards.
    return {**os.environ, **QUICK, "TMPDIR": str(tmp_path), **more}


def _left_running(tmp_path: Path) -> list[str]:
    """Processes that mention the run's directory: in their command line, their working
    directory or their environment (PYTHONPATH points into the clone)."""
    mark, found = str(tmp_path), []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
            env = " ".join(proc.environ().values())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if mark in cmdline or mark in (proc.info["cwd"] or "") or mark in env:
            found.append(f"{proc.info['pid']} {cmdline}")
    return found


def _ports(output: str) -> list[int]:
    """The emulators' and the proxy's ports, as `kvmigrate init` printed them."""
    wrote = re.search(
        r"from http://127\.0\.0\.1:(\d+)/v1 .* at http://127\.0\.0\.1:(\d+)/v1", output
    )
    proxy = re.search(r"OPENAI_BASE_URL=http://127\.0\.0\.1:(\d+)/v1", output)
    assert wrote, output[-3000:]
    assert proxy, output[-3000:]
    return [int(wrote[1]), int(wrote[2]), int(proxy[1])]


def _assert_nothing_left(tmp_path: Path, output: str) -> None:
    # The script waits for what it stopped; a moment for the kernel to finish the reaping.
    deadline = time.monotonic() + 5
    while _left_running(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _left_running(tmp_path) == []
    for port in _ports(output):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert list(tmp_path.glob("kvmigrate-playbook-*")) == [], "the work directory stayed"


@pytest.mark.slow
@pytest.mark.timeout(RUN_BOUND_S + 60)
def test_the_playbook_runs_the_whole_table_and_leaves_nothing_running(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "playbook.sh")],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=RUN_BOUND_S,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    steps = re.findall(r"^=== (.*) ===$", proc.stdout, re.M)
    for phase in ("a new config: kvmigrate init", "Evaluate: doctor", "Pilot: report", "Plan: calibrate",
                  "Production: rollout auto", "Production: status, rollback"):  # fmt: skip
        assert any(s.startswith(phase) for s in steps), steps
    assert "rollout complete at 100%" in proc.stdout
    assert "playbook passed" in proc.stdout
    _assert_nothing_left(tmp_path, output)


# The playbook as a terminal starts it: with SIGINT's default action. A suite started in the
# background (`bash .ci/run &`, nohup) ignores SIGINT, every child inherits that across exec,
# and bash can neither trap nor reset a signal ignored when it started, so Ctrl-C would
# reach nothing. The same pid runs bash, after the reset.
AT_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp('bash', ['bash', sys.argv[1]])"
)


@pytest.mark.slow
@pytest.mark.timeout(RUN_BOUND_S)
@pytest.mark.parametrize(
    ("how", "rc"), [("ctrl-c", 130), ("kill", 143)], ids=["SIGINT to the group", "SIGTERM"]
)
def test_an_interrupted_playbook_stops_what_it_started(tmp_path: Path, how: str, rc: int) -> None:
    """Ctrl-C at a terminal signals the whole foreground group; `kill` only the script.
    Either way the emulators and the proxy, each in a group of its own, are stopped."""
    with subprocess.Popen(
        [sys.executable, "-c", AT_A_TERMINAL, str(REPO / "scripts" / "playbook.sh")],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("=== Pilot: the proxy in shadow"):
                break
        else:
            pytest.fail("".join(lines[-50:]))
        time.sleep(3)  # the proxy up, conversations going through it
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    output = "".join(lines) + rest
    assert proc.returncode == rc, output[-3000:]
    _assert_nothing_left(tmp_path, output)
