"""What recording costs the proxy's event loop: timer lateness while records stream in.

    .venv/bin/python benchmarks/recorder_loop_lag.py [--rate 4000] [--seconds 5] [--system-kb 0]

An asyncio loop (the proxy's, in miniature) wakes every millisecond, hands `rate` records
per second to the recorder with `exchange_done`, and notes how late each wake-up was. The
same run measures three set-ups: no recorder (the baseline), the recorder's work on a
thread of this process (the design before the worker process), and the worker process.
Lateness is what every request in flight would wait on top of its own work: time the loop
could not run because another thread held the GIL. Records are the streamed chat answers
of `recorder_throughput.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from recorder_throughput import _exchange, _payload

from kvmigrate.config.model import RecordConfig
from kvmigrate.percentile import percentile
from kvmigrate.proxy.exchange import Exchange
from kvmigrate.recorder import RecorderAddon, WriterSettings

TICK_S = 0.001


async def _drive(
    recorder: RecorderAddon | None, exchanges: list[Exchange], rate: int
) -> list[float]:
    """Lateness of each 1 ms tick, in ms, while `rate` records/s are handed over."""
    lateness: list[float] = []
    per_tick = rate * TICK_S
    owed = 0.0
    sent = 0
    start = time.perf_counter()
    for tick in range(1, int(len(exchanges) / per_tick)):
        due = start + tick * TICK_S
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        lateness.append((time.perf_counter() - due) * 1000)
        owed += per_tick
        while owed >= 1 and sent < len(exchanges):
            if recorder is not None:
                recorder.exchange_done(exchanges[sent])
            sent += 1
            owed -= 1
    return lateness


def _measure(
    worker: str | None, args: argparse.Namespace, tmp: str
) -> tuple[float | None, float | None, int, float]:
    messages, chunks = _payload()
    if args.system_kb:  # a long agent's turn: every request resends a long prompt
        messages = [
            {"role": "system", "content": "You are a coding agent. " * (args.system_kb * 43)}
        ]
    count = int(args.rate * args.seconds)
    exchanges = [_exchange(i, messages, chunks) for i in range(count)]
    recorder = None
    if worker is not None:
        settings = WriterSettings(queue_size=count + 1)
        recorder = RecorderAddon(
            f"sqlite:///{tmp}/{worker}.db",
            settings=settings,
            worker=worker,
            workers=args.workers,
        )
        recorder.start()
        time.sleep(1.0)  # the worker is up, as in a proxy that has been serving
    started = time.perf_counter()
    lateness = asyncio.run(_drive(recorder, exchanges, args.rate))
    written = 0
    if recorder is not None:
        recorder.close(timeout=600)
        written = recorder.stats.written
    return (
        percentile(lateness, 50),
        percentile(lateness, 99),
        written,
        time.perf_counter() - started,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=4000, help="records handed over per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--workers",
        type=int,
        default=RecordConfig().workers,
        help="worker processes (default: record.workers' default)",
    )
    parser.add_argument("--skip-thread", action="store_true", help="no thread set-up")
    parser.add_argument(
        "--system-kb", type=int, default=0, help="a system prompt of about this many KB"
    )
    args = parser.parse_args()
    print(f"{args.rate:,} records/s for {args.seconds:g} s; event-loop lateness per 1 ms tick")
    with tempfile.TemporaryDirectory() as tmp:
        setups = [("no recorder", None), ("thread", "thread"), ("process", "process")]
        for label, worker in setups:
            if worker == "thread" and args.skip_thread:
                continue
            p50, p99, written, took = _measure(worker, args, tmp)
            print(f"  {label:12s} p50 {p50:6.3f} ms   p99 {p99:6.3f} ms   written {written:,}")
            if worker is not None:
                # Handing over took `seconds`; beyond that, the recorder was catching up.
                print(f"  {'':12s} all written {took:.1f} s after the first was handed over")


if __name__ == "__main__":
    main()
