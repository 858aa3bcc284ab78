"""Recorder throughput: records/s the writer thread sustains, and what `exchange_done` costs
on the proxy's response path.

    .venv/bin/python benchmarks/recorder_throughput.py [--records 50000] [--content redacted]

Each record is a realistic streamed chat answer (about 40 SSE chunks with usage) for a
multi-turn request of a few KB, so the figure includes SSE reassembly and redaction, not
just the INSERT."""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    request, chunks = _payload()
    exchanges = [_exchange(i, request, chunks) for i in range(args.records)]

    with tempfile.TemporaryDirectory() as tmp:
        settings = WriterSettings(queue_size=args.records + 1, batch_size=args.batch_size)
        recorder = RecorderAddon(f"sqlite:///{tmp}/bench.db", args.content, settings=settings)
        # The response-path cost: exchange_done alone, before the writer competes for the GIL.
        started = time.perf_counter()
        for x in exchanges:
            recorder.exchange_done(x)
        hot_path_us = (time.perf_counter() - started) / len(exchanges) * 1e6
        # The writer's sustained rate: drain the full queue into SQLite.
        started, cpu_started = time.perf_counter(), time.process_time()
        recorder.start()
        recorder.close(timeout=600)
        elapsed = time.perf_counter() - started
        # CPU seconds too: on a shared machine the wall clock also counts other tenants.
        cpu = time.process_time() - cpu_started
        stats = recorder.stats

    print(f"records:                 {args.records:,} (content={args.content})")
    written = f"{stats.written:,} in {stats.batches} batches, dropped {stats.dropped}"
    print(f"written:                 {written}")
    print(f"writer throughput:       {stats.written / elapsed:,.0f} records/s (wall clock)")
    print(
        f"writer CPU cost:         {cpu / max(stats.written, 1) * 1e6:.0f} µs per record "
        f"= {stats.written / max(cpu, 1e-9):,.0f} records per CPU-second"
    )
    print(f"exchange_done:           {hot_path_us:.2f} µs per call (response path)")


if __name__ == "__main__":
    main()
