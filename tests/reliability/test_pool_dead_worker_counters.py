"""`kvmigrate proxy --workers 2` with a worker killed: the pool's counters never go backwards.

The recorder's counters (`kvmigrate_records_written_total`, ...) are read from the worker's
own state at scrape time and reach the other workers through its snapshot file: a killed
worker's snapshot must keep counting them, or Prometheus' rate() sees a reset that is none.
Real processes, real emulated backends on loopback."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil  # type: ignore[import-untyped]
import pytest
from reliability_support import proxy_config

from kvmigrate.embedded import emulated_backends
from kvmigrate.serving import free_port

MODEL = "gpt-4o-mini"
DEADLINE_S = 30.0  # generous: a loaded machine is slow; these are not timings
WRITTEN = "kvmigrate_records_written_total"


def _workers(parent: subprocess.Popen[bytes]) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(parent.pid).children():
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass
    return found


def _listening(parent: subprocess.Popen[bytes], port: int) -> set[int]:
    pids = set()
    for worker in _workers(parent):
        try:
            conns = worker.net_connections("tcp")
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns):
            pids.add(worker.pid)
    return pids


def _wait(check: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=DEADLINE_S) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _ask(url: str) -> None:
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Connection": "close"},
    )
    with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
        assert response.status == 200


def _written_by(directory: Path, pid: int) -> float:
    """What a worker's last snapshot says it wrote (0 before its first snapshot)."""
    try:
        families = orjson.loads((directory / f"collected_{pid}.json").read_bytes())
    except FileNotFoundError:
        return 0.0
    return float(
        sum(
            value
            for name, _kind, _doc, samples in families
            if name == "kvmigrate_records_written"
            for sample_name, _labels, value in samples
            if sample_name == WRITTEN
        )
    )


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, int]]:
    with emulated_backends(time_scale=0.01) as backends:
        port = free_port()
        config = proxy_config(tmp_path, port, backends.hosted_url, backends.vllm_url)
        argv = [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(config)]
        with (tmp_path / "proxy.log").open("wb") as log:
            proc = subprocess.Popen([*argv, "--workers", "2"], stdout=log, stderr=log)
            try:
                _wait(lambda: len(_listening(proc, port)) == 2, "two listening workers")
                yield proc, f"http://127.0.0.1:{port}", port
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)


def test_a_killed_workers_recorder_counts_stay_in_the_pools_totals(
    pool: tuple[subprocess.Popen[bytes], str, int],
) -> None:
    proc, url, port = pool
    directory = Path(_workers(proc)[0].environ()["PROMETHEUS_MULTIPROC_DIR"])
    for _ in range(20):
        _ask(url)
    workers = sorted(_listening(proc, port))
    # Every answer written and in both workers' snapshots (each taken every second).
    _wait(lambda: sum(_written_by(directory, p) for p in workers) == 20, "20 records written")
    victim = max(workers, key=lambda pid: _written_by(directory, pid))
    assert _written_by(directory, victim) > 0
    psutil.Process(victim).send_signal(signal.SIGKILL)
    _wait(
        lambda: len(_listening(proc, port)) == 2 and victim not in _listening(proc, port),
        "a replacement worker",
    )
    # A scrape lands on either worker: each one must still count the dead worker's records.
    assert {_metric(url, WRITTEN) for _ in range(10)} == {20.0}
