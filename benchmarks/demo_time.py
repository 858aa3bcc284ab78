"""How long `kvmigrate demo` takes: the README's first command, and the smaller run that
tests/test_demo.py makes (which asserts what the demo does, not how long it takes; its
subprocess timeout only stops a hang).

    python benchmarks/demo_time.py            # both
    python benchmarks/demo_time.py --test-only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

TEST_ARGS = ["--conversations", "18", "--turns", "4", "--time-scale", "0.3"]


def timed(args: list[str]) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "kvmigrate", "demo", "--out", f"{tmp}/report.html", *args],
            capture_output=True,
            cwd=tmp,
            check=False,
        )
        return time.monotonic() - started, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test-only", action="store_true")
    only_test = parser.parse_args().test_only
    for name, args in [("test_demo.py's run", TEST_ARGS), ("kvmigrate demo", [])]:
        if only_test and not args:
            continue
        seconds, code = timed(args)
        print(f"{name:>20}: {seconds:6.1f} s (exit {code})")


if __name__ == "__main__":
    main()
