"""How long the CLI takes to start: `kvmigrate --help` and `kvmigrate rollout status`.

    .venv/bin/python benchmarks/cli_startup.py [--runs 15] [--top 8]

Each command runs `--runs` times as a fresh subprocess (`python -m kvmigrate ...`, as the
console script does) after one warm-up; the median, min and max wall time are printed, with
bare interpreter start-up as the floor. `rollout status` reads a SQLite state store in a
temporary directory, and the gates read an empty records database there. A run under
`python -X importtime` then gives each command's module count and the imports that cost
the most, cumulative (a package's time includes what it imports).

Targets (issue 24): `--help` <= 0.3 s, `rollout status` <= 0.6 s.
"""

from __future__ import annotations

import argparse
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


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


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
    _wall(argv)  # warm-up: the OS file cache, and the state store's first write
    times = [_wall(argv) for _ in range(runs)]
    count, costliest = _imports(argv, top)
    print(
        f"{label:<26} median {statistics.median(times):.3f} s  "
        f"(min {min(times):.3f}, max {max(times):.3f}, {runs} runs)  {count} modules imported"
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
