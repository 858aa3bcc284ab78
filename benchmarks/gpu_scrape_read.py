"""What reading one vLLM /metrics answer costs the GPU scrape's thread, against a full parse.

The scrape reads only the lines of the metrics it needs (kvmigrate.engine.prom_text); the
baseline is prometheus_client's parser, which builds every family and sample. The answer
is the vLLM emulator's /metrics after some traffic, padded with the process and GC
metrics and per-handler HTTP histograms a real vLLM server also exports (`--pad`), or a
file of a real server's answer (`--file`). Printed: microseconds per read for each, and
their ratio, measured in the same run.

    python benchmarks/gpu_scrape_read.py [--file metrics.txt] [--pad 40] [--reps 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvmigrate.emulator import EmulatorSettings
from kvmigrate.emulator.latency import PrefillEngine
from kvmigrate.emulator.metrics import EmulatorMetrics
from kvmigrate.engine.vllm_sample import read_vllm


def emulator_answer(pad: int) -> str:
    metrics = EmulatorMetrics(EmulatorSettings(profile="vllm"), PrefillEngine(4))
    for i in range(200):
        metrics.prompt(1000 + i, 512)
        metrics.first_token(0.01 * (i % 50))
        metrics.finished(64, ["stop"], 0.5)
    registry = CollectorRegistry()
    http = Histogram("http_request_duration_seconds", "", ["handler"], registry=registry)
    for i in range(pad):
        http.labels(f"/v1/route_{i}").observe(0.1)
    return (metrics.render() + generate_latest(registry)).decode()


def per_read_us(read: Callable[[str], object], text: str, reps: int) -> float:
    started = time.perf_counter()
    for _ in range(reps):
        read(text)
    return (time.perf_counter() - started) / reps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, help="a vLLM server's /metrics answer")
    parser.add_argument("--pad", type=int, default=40, help="HTTP handler histograms added")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    text = args.file.read_text() if args.file else emulator_answer(args.pad)
    lines = text.count("\n")
    full = per_read_us(lambda t: list(text_string_to_metric_families(t)), text, args.reps)
    ours = per_read_us(read_vllm, text, args.reps)
    print(f"answer: {len(text):,} bytes, {lines:,} lines")
    print(f"prometheus_client full parse: {full:,.0f} us per read")
    print(f"kvmigrate read_vllm:          {ours:,.0f} us per read")
    print(f"ratio (full / ours):          {full / ours:.1f}")


if __name__ == "__main__":
    main()
