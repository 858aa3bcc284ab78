"""`kvmigrate proxy --workers 2` stops without a word from multiprocessing's resource
tracker, even after a worker died without its exit handlers (a crash, the OOM killer, the
kill at the end of a drain): a named semaphore it held was reclaimed with a "leaked
semaphore" warning at every such shutdown. Real processes, emulated backends on loopback."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import psutil  # type: ignore[import-untyped]
import pytest
from reliability_support import proxy_config

from kvmigrate.embedded import emulated_backends
from kvmigrate.serving import free_port

DEADLINE_S = 60.0  # generous: a loaded machine is slow; these are not timings


def _serving_pids(parent: subprocess.Popen[bytes]) -> set[int]:
    pids = set()
    for child in psutil.Process(parent.pid).children():
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                pids.add(child.pid)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass
    return pids


def _ask(url: str) -> None:
    body = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Connection": "close"},
    )
    with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
        assert response.status == 200


def _wait_for(check: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_pool_stops_without_leaked_semaphores(tmp_path: Path) -> None:
    with emulated_backends(time_scale=0.01) as backends:
        port = free_port()
        config = proxy_config(tmp_path, port, backends.hosted_url, backends.vllm_url)
        out, err = tmp_path / "stdout", tmp_path / "stderr"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(config),
                 "--workers", "2"],
                stdout=stdout,
                stderr=stderr,
            )  # fmt: skip
        try:
            _wait_for(lambda: b"worker processes" in out.read_bytes(), "the pool's banner")
            [pids] = re.findall(rb"pids ([\d, ]+)\)", out.read_bytes())
            first, _ = (int(p) for p in pids.split(b", "))
            url = f"http://127.0.0.1:{port}"
            for _ in range(4):
                _ask(url)  # each worker's recorder has work
            psutil.Process(first).kill()  # dies without its exit handlers
            _wait_for(lambda: len(_serving_pids(proc) - {first}) == 2, "a new worker")
            _ask(url)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(DEADLINE_S) == 0
    text = err.read_text()
    assert "died; starting another" in text  # the pool saw the crash
    assert "leaked" not in text, text
    assert "resource_tracker" not in text, text
