"""How long the CLI takes to start: `kvmigrate --help` and `kvmigrate rollout status`.

    .venv/bin/python benchmarks/cli_startup.py [--runs 15] [--top 8]

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
import resource
import statistics
import subprocess
import sys
import tempfile
import time
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


if __name__ == "__main__":
    main()
