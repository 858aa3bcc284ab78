"""`kvmigrate proxy --drain-seconds N` (one process, or `--workers 2`) with a stream longer
than the drain: it is cut at the drain the operator asked for, not twice it (aiohttp waits
its shutdown timeout for a handler, then again after cancelling the request's body). A pool's
parent kills workers at drain + 10 s, and Kubernetes at the grace period: a drain that ran
twice as long lost the recorder's queue to SIGKILL. Real processes on loopback."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from pathlib import Path

import orjson
import pytest
from reliability_support import proxy_config

from kvmigrate.embedded import EmulatedBackends, emulated_backends
from kvmigrate.serving import free_port


def _wait_serving(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, "the proxy exited"
        try:
            urllib.request.urlopen(url + "/health", timeout=5).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.1)


# Drain 0: stop at once (aiohttp reads a timeout of 0 as none, and waited for the stream).
@pytest.mark.slow
@pytest.mark.parametrize(("workers", "drain_s"), [("1", 3.0), ("2", 3.0), ("1", 0.0)])
def test_a_stream_longer_than_the_drain_is_cut_at_the_drain(
    tmp_path: Path, workers: str, drain_s: float
) -> None:
    # time_scale 20: the emulated answer streams for far longer than the drain.
    with emulated_backends(time_scale=20.0) as backends:
        url, proc = _start(tmp_path, backends, workers, drain_s)
        try:
            with urllib.request.urlopen(_streaming_request(url), timeout=120) as stream:
                stream.readline()  # the stream is open
                proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                lines = []
                while line := stream.readline():
                    lines.append(line)
                cut_after = time.monotonic() - signalled
            assert proc.wait(60) == 0
            _assert_told_and_recorded(lines, tmp_path)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    # The drain, with a margin for a loaded machine; aiohttp alone gave twice the drain.
    assert drain_s - 0.5 < cut_after < drain_s * 1.6 + 1.0


def _start(
    tmp_path: Path, backends: EmulatedBackends, workers: str, drain_s: float
) -> tuple[str, subprocess.Popen[bytes]]:
    """A proxy serving, its log in tmp_path/proxy.log."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = proxy_config(tmp_path, port, backends.hosted_url, backends.vllm_url)
    argv = [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(config)]
    argv += ["--workers", workers, "--drain-seconds", str(drain_s)]
    with (tmp_path / "proxy.log").open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out)
    _wait_serving(url, proc)
    return url, proc


def _assert_told_and_recorded(lines: list[bytes], tmp_path: Path) -> None:
    """Told, not cut silently: an SSE error event the SDKs raise, and a record of it."""
    events = [x for x in lines if x.startswith(b"data: ")]
    assert events, lines
    assert b"proxy_shutdown" in events[-1], lines[-3:]
    with closing(sqlite3.connect(tmp_path / "records.db")) as db:
        rows = db.execute("SELECT role, error FROM records").fetchall()
    assert rows == [("serve", "proxy_shutdown")]


def _streaming_request(url: str) -> urllib.request.Request:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 4000,
    }
    return urllib.request.Request(
        url + "/v1/chat/completions",
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json"},
    )


# Asked twice (a second Ctrl-C, a second SIGTERM): a drain sized for long agent streams
# (here two minutes) no longer holds the operator hostage.
@pytest.mark.slow
@pytest.mark.parametrize(("workers", "signum"), [("1", signal.SIGINT), ("2", signal.SIGTERM)])
def test_a_second_stop_signal_ends_the_drain_at_once(
    tmp_path: Path, workers: str, signum: signal.Signals
) -> None:
    with emulated_backends(time_scale=20.0) as backends:
        url, proc = _start(tmp_path, backends, workers, drain_s=120.0)
        try:
            with urllib.request.urlopen(_streaming_request(url), timeout=120) as stream:
                stream.readline()  # the stream is open
                proc.send_signal(signum)
                time.sleep(1.0)  # draining: the stream goes on
                assert proc.poll() is None
                proc.send_signal(signum)
                signalled = time.monotonic()
                lines = []
                while line := stream.readline():
                    lines.append(line)
                cut_after = time.monotonic() - signalled
            assert proc.wait(60) == 0, (tmp_path / "proxy.log").read_text()
            _assert_told_and_recorded(lines, tmp_path)
            assert "asked again to stop" in (tmp_path / "proxy.log").read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    # Far inside the drain, and before the emulated stream's own end (about 25 s on).
    assert cut_after < 15.0
