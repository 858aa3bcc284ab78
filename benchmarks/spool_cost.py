"""What the recorder's spool costs the proxy's own process, against no spool, in one run.

    python benchmarks/spool_cost.py [--rate 2000] [--seconds 4] [--reps 3]

An asyncio loop (the proxy's, in miniature) wakes every millisecond and hands `rate`
records per second to the recorder with `exchange_done`, as `recorder_loop_lag.py` does.
For each `record.durability` (`memory`: batches pickled into the workers' pipes, the design
before the spool; `spool`: appended to the spool, the pipe only nudges; `fsync`: the spool
synced every 0.1 s) it reports the CPU this process spent per record beyond the run
without a recorder (the response path's deque append and the feeder thread's packing,
spooling and counting: the workers' CPU is theirs, not counted), and the loop's lateness
per tick (what every request in flight would wait on top of its own work). Set-ups are
measured in turn, `reps` times, and the medians printed, as the machine's speed drifts.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from recorder_loop_lag import _drive
from recorder_throughput import _exchange, _payload

from kvmigrate.percentile import percentile
from kvmigrate.recorder import RecorderAddon, WriterSettings

SETUPS = ("none", "memory", "spool", "fsync")


def _measure(durability: str, rate: int, seconds: float, tmp: str) -> tuple[float, float, float]:
    """CPU seconds of this process while handing over, and the loop's lateness p50, p99."""
    messages, chunks = _payload()
    count = int(rate * seconds)
    exchanges = [_exchange(i, messages, chunks) for i in range(count)]
    recorder = None
    if durability != "none":
        recorder = RecorderAddon(
            f"sqlite:///{tmp}/{durability}-{time.monotonic_ns()}.db",
            settings=WriterSettings(queue_size=count + 1),
            durability=durability,
        )
        recorder.start()
        time.sleep(1.0)  # the workers are up, as in a proxy that has been serving
    cpu = time.process_time()
    lateness = asyncio.run(_drive(recorder, exchanges, rate))
    time.sleep(0.1)  # the feeder's last round
    cpu = time.process_time() - cpu
    if recorder is not None:
        recorder.close(timeout=600)
    return cpu, percentile(lateness, 50) or 0.0, percentile(lateness, 99) or 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2000, help="records handed over per second")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    count = int(args.rate * args.seconds)
    runs: dict[str, list[tuple[float, float, float]]] = {s: [] for s in SETUPS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.reps):
            for setup in SETUPS:
                runs[setup].append(_measure(setup, args.rate, args.seconds, tmp))
    print(f"{args.rate:,} records/s for {args.seconds:g} s, {args.reps} reps (medians)")
    base = statistics.median(r[0] for r in runs["none"])
    for setup in SETUPS:
        cpu = statistics.median(r[0] for r in runs[setup])
        p50 = statistics.median(r[1] for r in runs[setup])
        p99 = statistics.median(r[2] for r in runs[setup])
        extra = (cpu - base) / count * 1e6
        print(
            f"  {setup:7s} process CPU {cpu:6.2f} s  (+{extra:6.1f} us/record)   "
            f"loop lateness p50 {p50:6.3f} ms  p99 {p99:6.3f} ms"
        )


if __name__ == "__main__":
    main()
