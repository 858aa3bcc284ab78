"""The real redis-server the store tests share (one per session, per xdist worker), started
by tests/conftest.py's `redis_server` fixture; its type, for the tests that pause it."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from services import missing

from kvmigrate.serving import free_port


@dataclass(frozen=True)
class RedisServer:
    url: str
    process: subprocess.Popen[bytes]  # a test may pause it (SIGSTOP), as a hung store


@contextmanager
def running_redis(workdir: Path) -> Iterator[RedisServer]:
    """A throwaway redis-server on a free loopback port (Debian's redis-server package)."""
    binary = shutil.which("redis-server") or missing("redis-server", "redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert proc.poll() is None, "redis-server exited at start"
        assert time.monotonic() < deadline, "redis-server did not listen"
        time.sleep(0.05)
    try:
        yield RedisServer(f"redis://127.0.0.1:{port}/0", proc)
    finally:
        proc.send_signal(signal.SIGCONT)  # if a test left it paused
        proc.terminate()
        proc.wait(10)
