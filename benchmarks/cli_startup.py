"""How long the CLI takes to start: `kvmigrate --help`, `kvmigrate rollout status`, a
`kvmigrate proxy` until it answers `/health`, and `kvmigrate report`.

    .venv/bin/python benchmarks/cli_startup.py [--runs 15] [--top 8] [--records CONFIG]

`--records CONFIG` times `report --since all` over that config's records (the demo's, kept
with `kvmigrate demo --workdir DIR`, say); without it the report reads an empty database.
A proxy's time is from its spawn to the first 200 from `/health` (polled every 10 ms), its
CPU what it used until then; it is stopped with SIGTERM after each run.

Each command runs `--runs` times as a fresh subprocess (`python -m kvmigrate ...`, as the
console script does) after one warm-up; the median, min and max wall time are printed, with
bare interpreter start-up as the floor, and the median CPU time (user + system) of the
child, which a busy machine disturbs less than the wall time. `rollout status` reads a
SQLite state store in a temporary directory, and the gates read an empty records database
there. A run under `python -X importtime` then gives each command's module count and the
imports that cost the most, cumulative (a package's time includes what it imports).

Targets (issue 24): `--help` <= 0.3 s, `rollout status` <= 0.6 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CONFIG = """
backends:
  hosted: {{api_base: http://127.0.0.1:9/v1}}
  vllm: {{api_base: http://127.0.0.1:9/v1}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama}}
rollout:
  state: sqlite:///{root}/state.db
record:
  db: sqlite:///{root}/records.db
"""


def _run(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def _serving(argv: list[str], port: int) -> tuple[float, float]:
    """Wall seconds from spawning a server to its first `/health` 200, and the CPU seconds
    it used by then."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"{argv} exited with {proc.returncode}") from None
                time.sleep(0.01)
        wall = time.perf_counter() - start
        with open(f"/proc/{proc.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return wall, cpu
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _proxy(cli: list[str], config: Path, runs: int) -> None:
    def once() -> tuple[float, float]:
        port = _free_port()
        return _serving([*cli, "proxy", "--config", str(config), "--port", str(port)], port)

    once()
    walls, cpus = zip(*(once() for _ in range(runs)), strict=True)
    print(
        f"{'kvmigrate proxy: /health':<26} median {statistics.median(walls):.3f} s "
        f"(min {min(walls):.3f}, max {max(walls):.3f}, {runs} runs), "
        f"CPU {statistics.median(cpus):.3f} s"
    )


def _imports(argv: list[str], top: int) -> tuple[int, list[tuple[int, str]]]:
    """Modules imported, and the `top` costliest by cumulative microseconds."""
    proc = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    rows = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            _self, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append((int(cumulative), name.strip()))
    return len(rows), sorted(rows, reverse=True)[:top]


def _report(label: str, argv: list[str], runs: int, top: int) -> None:
    _run(argv)  # warm-up: the OS file cache, and the state store's first write
    walls, cpus = zip(*(_run(argv) for _ in range(runs)), strict=True)
    count, costliest = _imports(argv, top)
    print(
        f"{label:<26} median {statistics.median(walls):.3f} s "
        f"(min {min(walls):.3f}, max {max(walls):.3f}, {runs} runs), "
        f"CPU {statistics.median(cpus):.3f} s, {count} modules imported"
    )
    for cumulative, name in costliest:
        print(f"    {cumulative / 1000:7.1f} ms  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--top", type=int, default=8, help="costliest imports to list")
    parser.add_argument("--records", type=Path, help="a config whose records `report` reads")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "kvmigrate"]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(CONFIG.format(root=tmp))
        _report("python -c pass (floor)", [sys.executable, "-c", "pass"], args.runs, 0)
        _report("kvmigrate --help", [*cli, "--help"], args.runs, args.top)
        _report(
            "kvmigrate rollout status",
            [*cli, "rollout", "status", "--config", str(config)],
            args.runs,
            args.top,
        )
        _proxy(cli, config, max(3, args.runs // 3))
        _report(
            "kvmigrate report",
            [*cli, "report", "--since", "all", "--config", str(args.records or config)],
            max(3, args.runs // 3),
            args.top,
        )


if __name__ == "__main__":
    main()
