"""Recorder throughput: records/s the recorder sustains, and what it costs the proxy's
process (`exchange_done` on the response path, plus feeding the worker process).

    .venv/bin/python benchmarks/recorder_throughput.py [--records 50000] [--content redacted]
        [--worker process|thread]

Each record is a realistic streamed chat answer (about 40 SSE chunks with usage) for a
multi-turn request of a few KB, so the figure includes SSE reassembly and redaction, not
just the INSERT."""

from __future__ import annotations

import argparse
import resource
import tempfile
import time

import orjson

from kvmigrate.proxy.exchange import SERVE, Exchange
from kvmigrate.recorder import RecorderAddon, WriterSettings


def _exchange(i: int, messages: list[dict[str, str]], chunks: list[bytes]) -> Exchange:
    # The history repeats across records (as an agent resends it), the newest message is new.
    latest = {"role": "user", "content": f"request {i}: mail the log to dev{i}@example.com"}
    request = orjson.dumps(
        {"model": "gpt-4o-mini", "stream": True, "messages": [*messages, latest]}
    )
    now = time.perf_counter()
    x = Exchange(
        request_id=f"req_{i:012d}", route="chat/completions", backend="hosted", role=SERVE,
        model="gpt-4o-mini", served_model="gpt-4o-mini", conversation=f"conv-{i % 500}",
        turn=i % 12 + 1, stream=True, started=now - 0.2, request_body=request,
        status=200, first_byte=now - 0.15, finished=now,
    )  # fmt: skip
    x.chunks = chunks
    return x


def _payload() -> tuple[list[dict[str, str]], list[bytes]]:
    messages = [{"role": "system", "content": "You are a coding agent. " * 40}]
    for turn in range(6):
        messages.append({"role": "user", "content": f"step {turn}: call me at +1 415-555-0132"})
        messages.append({"role": "assistant", "content": "Working on it. " * 10})
    chunks = []
    for k in range(40):
        delta = {"content": f"word{k} "}  # 40 chunks of streamed answer
        event = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
        chunks.append(b"data: " + orjson.dumps(event) + b"\n\n")
    usage = {"prompt_tokens": 900, "completion_tokens": 40, "total_tokens": 940,
             "prompt_tokens_details": {"cached_tokens": 768}}  # fmt: skip
    last = [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    final = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": last, "usage": usage}  # fmt: skip
    chunks += [b"data: " + orjson.dumps(final) + b"\n\n", b"data: [DONE]\n\n"]
    return messages, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--content", choices=["none", "redacted", "full"], default="redacted")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--worker", choices=["process", "thread"], default="process")
    args = parser.parse_args()
    request, chunks = _payload()
    exchanges = [_exchange(i, request, chunks) for i in range(args.records)]

    with tempfile.TemporaryDirectory() as tmp:
        settings = WriterSettings(queue_size=args.records + 1, batch_size=args.batch_size)
        recorder = RecorderAddon(
            f"sqlite:///{tmp}/bench.db", args.content, settings=settings, worker=args.worker
        )
        # The response-path cost: exchange_done alone, before the writer competes for the GIL.
        started = time.perf_counter()
        for x in exchanges:
            recorder.exchange_done(x)
        hot_path_us = (time.perf_counter() - started) / len(exchanges) * 1e6
        # The sustained rate: drain the full queue into SQLite.
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started, cpu_started = time.perf_counter(), time.process_time()
        recorder.start()
        recorder.close(timeout=600)
        elapsed = time.perf_counter() - started
        # CPU seconds too: on a shared machine the wall clock also counts other tenants.
        own_cpu = time.process_time() - cpu_started
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        worker_cpu = (children.ru_utime + children.ru_stime) - (
            children_before.ru_utime + children_before.ru_stime
        )
        stats = recorder.stats
    _report(args, stats.written, stats.batches, stats.dropped, elapsed, own_cpu, worker_cpu)
    print(f"exchange_done:           {hot_path_us:.2f} µs per call (response path)")


def _report(
    args: argparse.Namespace,
    written: int,
    batches: int,
    dropped: dict[str, int],
    elapsed: float,
    own_cpu: float,
    worker_cpu: float,
) -> None:
    per_record = max(written, 1)
    print(f"records:                 {args.records:,} (content={args.content}, {args.worker})")
    print(f"written:                 {written:,} in {batches} batches, dropped {dropped}")
    print(f"throughput:              {written / elapsed:,.0f} records/s (wall clock)")
    if args.worker == "process":
        print(
            f"worker process CPU:      {worker_cpu / per_record * 1e6:.0f} µs per record "
            f"= {written / max(worker_cpu, 1e-9):,.0f} records per CPU-second"
        )
        print(
            f"proxy process CPU:       {own_cpu / per_record * 1e6:.1f} µs per record "
            "(feeding the worker: packing and pickling)"
        )
    else:
        print(
            f"writer CPU (in-process): {own_cpu / per_record * 1e6:.0f} µs per record "
            f"= {written / max(own_cpu, 1e-9):,.0f} records per CPU-second"
        )


if __name__ == "__main__":
    main()
