"""What loading the config costs: `load_config` on a file, in a fresh process and warm.

    .venv/bin/python benchmarks/config_load.py [--config config.yaml] [--repeat 2000]

Prints the import of `kvmigrate.config` (once per process, what every CLI command pays),
then the median and p95 of `repeat` loads of the same file (read, YAML parse, validation).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    start = time.perf_counter()
    from kvmigrate.config import load_config

    imported = time.perf_counter() - start
    env = {"KVMIGRATE_MASTER_KEY": "mk", "KVMIGRATE_ADMIN_KEY": "ak"}
    load_config(args.config, env=env)
    timings = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        load_config(args.config, env=env)
        timings.append(time.perf_counter() - start)
    timings.sort()
    p95 = timings[int(len(timings) * 0.95)]
    print(f"import kvmigrate.config: {imported * 1000:.1f} ms")
    median = statistics.median(timings)
    print(
        f"load_config({args.config!r}) x{args.repeat}: median {median * 1e3:.3f} ms,"
        f" p95 {p95 * 1e3:.3f} ms"
    )


if __name__ == "__main__":
    main()
