"""What the decode clock adds per relayed chunk, against what the relay loop already does
per chunk (the chunk logged for the recorder), measured in the same run.

The proxy reads a clock per chunk for decode speed (kvmigrate.proxy.forward._DecodeClock);
this prints that cost in ns and as a ratio to a `ChunkLog.append`, the cheapest thing the
loop did per chunk before. A second or so of one core.

    python benchmarks/decode_clock_cost.py [--chunks 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

from kvmigrate.exchange import SERVE, Exchange
from kvmigrate.proxy.forward import _DecodeClock
from kvmigrate.wire.chunk_log import ChunkLog

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":" word"}}]}\n\n'


def _exchange() -> Exchange:
    x = Exchange("r", "chat/completions", "vllm", SERVE, "m", "m", "c", 1, True, 0.0)
    x.first_byte = time.perf_counter()
    return x


def append_only(n: int) -> float:
    log = ChunkLog()
    start = time.perf_counter()
    for _ in range(n):
        log.append(CHUNK)
    return time.perf_counter() - start


def append_and_tick(n: int) -> float:
    log, clock = ChunkLog(), _DecodeClock(_exchange())
    start = time.perf_counter()
    for _ in range(n):
        clock.tick()
        log.append(CHUNK)
    clock.stop()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    base = min(append_only(args.chunks) for _ in range(args.repeats))
    both = min(append_and_tick(args.chunks) for _ in range(args.repeats))
    per_append = base / args.chunks * 1e9
    per_tick = (both - base) / args.chunks * 1e9
    print(f"ChunkLog.append: {per_append:.0f} ns per chunk")
    print(f"decode clock:    {per_tick:.0f} ns per chunk ({per_tick / per_append:.2f} x an append)")


if __name__ == "__main__":
    main()
