"""A server that serves until it is stopped settles its garbage collector once listening:
the single proxy and every worker of `proxy --workers N` alike, since both listen through
`serve_until`. Run in a child process: settling freezes the heap it runs in."""

from __future__ import annotations

import subprocess
import sys

from kvmigrate.collector import YOUNG_THRESHOLD

CHILD = """
import asyncio, gc
from aiohttp import web
from kvmigrate.serving import free_port, serve_until

async def main():
    stop = asyncio.Event()
    seen = []
    def ready():
        seen.append((gc.get_threshold()[0], gc.get_freeze_count() > 0))
        stop.set()
    print("before", gc.get_threshold()[0])
    await serve_until(web.Application(), "127.0.0.1", free_port(), stop, ready, reuse_port=True)
    print("ready", *seen[0])

asyncio.run(main())
"""


def test_a_listening_server_settles_its_collector() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split("\n")
    assert out[0] == "before 700"  # CPython's default, which cost a worker 27 us a request
    assert out[1] == f"ready {YOUNG_THRESHOLD} True"
