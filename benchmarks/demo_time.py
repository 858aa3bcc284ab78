"""How long `kvmigrate demo` takes, wall and CPU (the demo's processes, children included):
the README's first command, which tests/demo/test_demo.py runs too (asserting what the demo does;
its bound only catches a demo grown several times longer), and `--full`, the longer story.
On a shared machine the wall time follows the load: compare runs side by side (--repeat
alternates them) and read the CPU time too.

    python benchmarks/demo_time.py               # the default demo
    python benchmarks/demo_time.py --full        # and the longer story, alternating
    python benchmarks/demo_time.py --repeat 2
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time


def timed(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user and system, of the demo and its children) and the
    exit status of one `kvmigrate demo` run."""
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "kvmigrate", "demo", "--out", f"{tmp}/report.html", *args],
            capture_output=True,
            cwd=tmp,
            check=False,
        )
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        return wall, cpu, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="time `demo --full` too")
    parser.add_argument("--repeat", type=int, default=1)
    options = parser.parse_args()
    runs = [("kvmigrate demo", [])] + ([("kvmigrate demo --full", ["--full"])] * options.full)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for _ in range(options.repeat):
        for name, args in runs:
            wall, cpu, code = timed(args)
            print(f"{name:>22}: {wall:6.1f} s wall, {cpu:6.1f} s CPU (exit {code})")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
