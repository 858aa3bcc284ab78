"""Does a recorder-on proxy answer slowly right after it starts against a records file?

Fills a records file through one proxy (`--fill` requests at 64 connections), then starts
a fresh proxy on the same file and times two runs of 500 requests at concurrency 1 from
its first request, with the p50 of each 100. The proxy is pinned to core 0 with its worker
processes (as a pinned deployment has them); the stub and this load generator to core 1.

    python benchmarks/restart_slow_start.py [--fill 20000]

Issue #23 saw one such run at p50 15.9 ms for 500 requests; docs/performance-history.md
("The transport's floor") has the figures with the workers at nice +5 and today.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
BODY = json.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a careful coding agent. " * 40},
            {"role": "user", "content": "Why?"},
        ],
        "max_tokens": 64,
    }
).encode()
HEADERS = {"Authorization": "Bearer sk-client", "Content-Type": "application/json"}


def write_config(path: Path, port: int, stub: str) -> None:
    path.write_text(f"""
server: {{host: 127.0.0.1, port: {port}}}
backends:
  hosted: {{api_base: "{stub}/v1"}}
  vllm: {{api_base: "{stub}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama}}
rollout: {{mode: shadow, shadow_sample: 0, noise_sample: 0, state: "sqlite:///{path.parent}/state.db"}}
record: {{enabled: true, db: "sqlite:///{path.parent}/records.db"}}
cachecheck: {{enabled: true}}
""")


async def run(url: str, total: int, concurrency: int, label: str) -> None:
    timings: list[tuple[float, float]] = []
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker(count: int) -> None:
            for _ in range(count):
                sent = time.perf_counter()
                async with session.post(url, data=BODY, headers=HEADERS) as response:
                    await response.read()
                timings.append((sent - start, time.perf_counter() - sent))

        await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    ms = [t * 1000 for _, t in timings]
    print(f"{label}: {len(ms) / elapsed:7.0f} req/s, p50 {statistics.median(ms):6.2f} ms")
    if concurrency == 1:
        for i in range(0, len(ms), 100):
            at, p50 = timings[i][0], statistics.median(ms[i : i + 100])
            print(f"    requests {i}-{i + 99} (from {at:.1f} s): p50 {p50:6.2f} ms")


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing listens on {port}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fill", type=int, default=20000, help="requests to fill the records file")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    stub_port, port = free_port(), free_port()
    stub = subprocess.Popen(
        [sys.executable, str(HERE / "upstream_stub.py"), "--port", str(stub_port)],
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        wait_port(stub_port)
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "config.yaml"
            write_config(config, port, f"http://127.0.0.1:{stub_port}")
            argv = ["taskset", "-c", "0", sys.executable, "-m", "kvmigrate", "proxy"]
            for phase in ("fill", "restart"):
                proxy = subprocess.Popen(
                    [*argv, "--config", str(config), "--workers", "1"],
                    cwd=tempfile.gettempdir(),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
                try:
                    wait_port(port)
                    if phase == "fill":
                        asyncio.run(run(url, args.fill, 64, f"fill, {args.fill} at c=64"))
                    else:
                        asyncio.run(run(url, 500, 1, "after the restart, c=1, run 1"))
                        asyncio.run(run(url, 500, 1, "after the restart, c=1, run 2"))
                finally:
                    proxy.send_signal(signal.SIGINT)
                    proxy.wait(120)
                size = (Path(tmp) / "records.db").stat().st_size
                print(f"{phase}: records file {size / 2**20:.1f} MiB")
    finally:
        stub.kill()


if __name__ == "__main__":
    main()
