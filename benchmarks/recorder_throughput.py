"""Recorder throughput: records/s the recorder sustains, and what it costs the proxy's
process (`exchange_done` on the response path, plus feeding the worker process).

    .venv/bin/python benchmarks/recorder_throughput.py [--records 50000] [--content redacted]
        [--worker process|thread]

Each record is a streamed chat answer (40 SSE chunks with usage, its own words) to one
turn of an agent loop: 500 conversations at once, 12 turns each, every request its
predecessor plus the last answer and a new message (1-4 KB; 24 messages by the 12th
turn). So the figure includes SSE reassembly, redaction and the history's storage, not
just the INSERT."""

from __future__ import annotations

import argparse
import functools
import random
import tempfile
import time
from collections.abc import Callable

import orjson
import psutil

from kvmigrate.config.model import RecordConfig
from kvmigrate.proxy.exchange import SERVE, SHADOW, Exchange
from kvmigrate.recorder import RecorderAddon, WriterSettings

CONVERSATIONS = 500  # interleaved, as many agents at once would be
TURNS = 12


def _exchange(
    i: int, messages: list[dict[str, str]], chunks: list[bytes], shadow: bool = False
) -> Exchange:
    """The i-th record: turn `t` of one of CONVERSATIONS agent loops, whose request is its
    previous one plus the last answer and a new user message, as an agent resends it.
    Every answer is different (`_answer`), and comes back in the next turn's history.
    With `shadow`, odd records are the shadow copies of the even ones before them, with a
    slightly different answer: each pair is scored for parity, as in shadow mode.
    `chunks` (from `_payload`) gives the answers' framing; their words are the record's."""
    if shadow and i % 2:
        x = _exchange(i - 1, messages, chunks, shadow)
        x.request_id, x.backend, x.role, x.pair_id = f"req_{i:012d}", "vllm", SHADOW, x.request_id
        words = _answer(x.conversation, x.turn - 1)
        x.chunks = _stream([*words[:3], "other ", *words[4:]])
        x.has_shadow_copy = False
        return x
    block, slot = divmod(i // 2 if shadow else i, CONVERSATIONS)
    turn = block % TURNS
    conversation = f"conv-{slot + CONVERSATIONS * (block // TURNS)}"
    history = list(messages)
    for step in range(turn + 1):
        ask = f"{conversation} step {step}: call me at +1 415-555-0132, or mail dev{slot}@x.com"
        history.append({"role": "user", "content": ask})
        if step < turn:
            history.append({"role": "assistant", "content": "".join(_answer(conversation, step))})
    request = orjson.dumps({"model": "gpt-4o-mini", "stream": True, "messages": history})
    now = time.perf_counter()
    x = Exchange(
        request_id=f"req_{i:012d}", route="chat/completions", backend="hosted", role=SERVE,
        model="gpt-4o-mini", served_model="gpt-4o-mini", conversation=conversation,
        turn=turn + 1, stream=True, started=now - 0.2, request_body=request,
        status=200, first_byte=now - 0.15, finished=now,
    )  # fmt: skip
    x.chunks = _stream(_answer(conversation, turn))
    x.has_shadow_copy = shadow
    return x


# Prose with the odd number, as an agent's answers are.
_VOCABULARY = tuple(
    "the parser fails on the second token because its buffer is reset before the "  # noqa: SIM905
    "stream ends so I will move the reset after the loop and add a test that reads "
    "a long input in small pieces then run the suite again to check nothing else "
    "breaks in module 3 line 214".split()
)


@functools.cache
def _answer(conversation: str, turn: int) -> list[str]:
    """A turn's 40 streamed words: prose, drawn from the vocabulary by the turn."""
    draw = random.Random(f"{conversation}/{turn}")
    return [draw.choice(_VOCABULARY) + " " for _ in range(40)]


def _stream(words: list[str]) -> list[bytes]:
    """An answer as an OpenAI-style stream: one chunk a word, usage, then [DONE]."""
    chunks = []
    for word in words:
        choice = {"index": 0, "delta": {"content": word}, "finish_reason": None}
        event = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [choice]}  # fmt: skip
        chunks.append(b"data: " + orjson.dumps(event) + b"\n\n")
    usage = {"prompt_tokens": 900, "completion_tokens": len(words), "total_tokens": 940,
             "prompt_tokens_details": {"cached_tokens": 768}}  # fmt: skip
    last = [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    final = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": last, "usage": usage}  # fmt: skip
    return [*chunks, b"data: " + orjson.dumps(final) + b"\n\n", b"data: [DONE]\n\n"]


def _payload() -> tuple[list[dict[str, str]], list[bytes]]:
    """The system prompt every conversation starts with, and one 40-chunk answer."""
    messages = [{"role": "system", "content": "You are a coding agent. " * 40}]
    return messages, _stream([f"word{k} " for k in range(40)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--content", choices=["none", "redacted", "full"], default="redacted")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--worker", choices=["process", "thread"], default="process")
    parser.add_argument(
        "--workers",
        type=int,
        default=RecordConfig().workers,
        help="worker processes (default: record.workers' default)",
    )
    parser.add_argument(
        "--shadow", action="store_true", help="every other record a shadow copy, parity-scored"
    )
    args = parser.parse_args()
    request, chunks = _payload()
    # Record 0 warms the recorder up; the pairs start at 1 (a serve record), then 2 ...
    exchanges = [_exchange(0, request, chunks)] + [
        _exchange(i, request, chunks, args.shadow) for i in range(2, args.records + 2)
    ]

    with tempfile.TemporaryDirectory() as tmp:
        settings = WriterSettings(queue_size=args.records + 1, batch_size=args.batch_size)
        recorder = RecorderAddon(
            f"sqlite:///{tmp}/bench.db",
            args.content,
            settings=settings,
            worker=args.worker,
            workers=args.workers,
        )
        # As in a proxy: the recorder is up (worker started, database open) before traffic.
        recorder.start()
        recorder.exchange_done(exchanges[0])
        _wait(lambda: recorder.stats.written == 1)
        workers = _worker_processes()
        worker_cpu, own_cpu = _cpu(workers), time.process_time()
        started = time.perf_counter()
        for x in exchanges[1:]:
            recorder.exchange_done(x)
        hot_path_us = (time.perf_counter() - started) / args.records * 1e6
        _wait(lambda: recorder.stats.written + sum(recorder.stats.dropped.values()) > args.records)
        elapsed = time.perf_counter() - started
        # CPU seconds too: on a shared machine the wall clock also counts other tenants.
        worker_cpu, own_cpu = _cpu(workers) - worker_cpu, time.process_time() - own_cpu
        stats = recorder.stats
        recorder.close(timeout=600)
    written = stats.written - 1
    how = f"{args.workers} worker process(es)" if args.worker == "process" else "thread"
    mix = ", half of them shadow copies scored for parity" if args.shadow else ""
    print(f"records:                 {args.records:,} (content={args.content}, {how}{mix})")
    print(
        f"written:                 {written:,} in {stats.batches} batches, dropped {stats.dropped}"
    )
    print(f"sustained throughput:    {written / elapsed:,.0f} records/s (wall clock)")
    if workers:
        print(
            f"worker process CPU:      {worker_cpu / written * 1e6:.0f} µs per record "
            f"= {written / max(worker_cpu, 1e-9):,.0f} records per CPU-second"
        )
        print(
            f"proxy process CPU:       {own_cpu / written * 1e6:.1f} µs per record "
            "(exchange_done, then packing and spooling on the feeder thread)"
        )
    else:
        print(
            f"proxy process CPU:       {own_cpu / written * 1e6:.0f} µs per record "
            "(in-process writer thread: all of it shares the proxy's GIL)"
        )
    print(f"exchange_done:           {hot_path_us:.2f} µs per call (response path)")


def _worker_processes() -> list[psutil.Process]:
    workers = []
    for child in psutil.Process().children():
        cmdline = " ".join(child.cmdline())
        if "spawn_main" in cmdline and "resource_tracker" not in cmdline:
            workers.append(child)
    return workers


def _cpu(processes: list[psutil.Process]) -> float:
    times = [p.cpu_times() for p in processes]
    return float(sum(t.user + t.system for t in times))


def _wait(predicate: Callable[[], bool], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("the recorder did not keep up within the timeout")
        time.sleep(0.005)


if __name__ == "__main__":
    main()
