"""SSE parsing cost, per chunk of a typical streamed chat answer (40 content chunks, usage,
`[DONE]`, one event a chunk as OpenAI and vLLM send them).

    .venv/bin/python benchmarks/sse_decode.py [--repeat 7]

  check        `SseCheck.feed`: the proxy's response path, once per chunk of a candidate's
               relayed stream
  check/cut    the same stream cut into 97-byte pieces (events split anywhere)
  events       `sse_events` over the whole body (parity, the Responses reassembly)
  usage        `Exchange.usage` of the streamed answer (the metrics, after the answer)

Each figure is the best of `--repeat` runs, divided by the 42 chunks of the stream."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import orjson

from kvmigrate.proxy.exchange import Exchange
from kvmigrate.proxy.stream_check import SseCheck
from kvmigrate.wire.sse import sse_events

LOOPS = 2000


MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def stream() -> list[bytes]:
    """A chat answer as an OpenAI-style stream: one chunk a word, usage, then [DONE]."""
    chunks = []
    for k in range(40):
        choice = {"index": 0, "delta": {"content": f"word{k} "}, "finish_reason": None}
        event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                 "model": MODEL, "choices": [choice]}  # fmt: skip
        chunks.append(b"data: " + orjson.dumps(event) + b"\n\n")
    usage = {"prompt_tokens": 900, "completion_tokens": 40, "total_tokens": 940,
             "prompt_tokens_details": {"cached_tokens": 768}}  # fmt: skip
    last = [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    final = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
             "model": MODEL, "choices": last, "usage": usage}  # fmt: skip
    return [*chunks, b"data: " + orjson.dumps(final) + b"\n\n", b"data: [DONE]\n\n"]


def best_us_per_chunk(run: Callable[[], object], chunks: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(LOOPS):
            run()
        times.append(time.perf_counter() - started)
    return min(times) / LOOPS / chunks * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    chunks = stream()
    body = b"".join(chunks)
    cut = [body[i : i + 97] for i in range(0, len(body), 97)]

    def check(pieces: list[bytes]) -> Callable[[], object]:
        def run() -> object:
            feed = SseCheck().feed
            return all([feed(piece) for piece in pieces])

        return run

    def usage() -> object:
        x = Exchange("r", "chat/completions", "vllm", "serve", "m", "m", "c", 1, True, 0.0)
        x.chunks = chunks
        return x.usage

    assert check(chunks)()
    assert check(cut)()
    n = len(chunks)
    print(f"stream: {n} chunks, {len(body):,} bytes")
    figures = {
        "check": check(chunks),
        "check/cut": check(cut),
        "events": lambda: list(sse_events(body)),
        "usage": usage,
    }
    for name, run in figures.items():
        print(f"{name:<10} {best_us_per_chunk(run, n, args.repeat):6.3f} µs per chunk")


if __name__ == "__main__":
    main()
