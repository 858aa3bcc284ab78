"""What routing a Responses API chained request costs next to a chat request, in microseconds.

The proxy's routing step for each, as `ProxyService._route` runs it, on parsed bodies:
  chat     turn 6 of a chat agent: conversation identity by continuity (one digest of the
           history, one in-process LRU hit), then `route()`
  chained  turn 6 of a `previous_response_id` chain: `chain_ref`, the response-id map (an
           in-process LRU hit: the store was read once, on the first sight of the id), then
           `route()` and `stick()`
and, for scale:
  chained_store_read  the same with the id not yet in this process: one read of the SQLite
                      rollout store (what a proxy pays once per id another proxy wrote)
  response_id_streamed  reading the answer's id off a streamed answer of about 200 chunks,
                      once the relay has ended (off the response path)
  answer_model_chunk  `server.answer_model: requested`: the splice on one relayed chunk that
                      names the model (a Responses event), and on one that does not
Target: a chained request adds at most 0.1 ms p50 over a chat request.

    python benchmarks/chain_overhead.py [--requests 5000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from kvmigrate.continuity.chains import ChainMap
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.policies import RolloutSnapshot, route
from kvmigrate.policies.chain import ChainEntry, chain_ref, stick
from kvmigrate.proxy.answer_model import answer_model_rewrite
from kvmigrate.rollout.sqlite_store import SqliteRolloutStore
from kvmigrate.rollout.state import RolloutState
from kvmigrate.wire.response_id import response_id

MODEL = "gpt-4o-mini"
SERVED = {"hosted": MODEL, "vllm": "meta-llama/Llama-3.1-8B-Instruct"}
SNAPSHOT = RolloutSnapshot("hosted", "vllm", "split", 50.0, 1.0, "kvmigrate")
SYSTEM = "You are a meticulous travel-planning assistant.\n" + "Short paragraphs, euros.\n" * 25


def _answer(turn: int) -> str:
    return f"Turn {turn}: " + "visit the museum, then lunch near the river; " * 12


def _chat_bodies(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": "Plan three days in Rome."}]
    bodies = []
    for turn in range(1, turns + 1):
        bodies.append(
            {"model": MODEL, "messages": [{"role": "system", "content": SYSTEM}, *history]}
        )
        history += [
            {"role": "assistant", "content": _answer(turn)},
            {"role": "user", "content": f"Good. What about day {turn + 1}, in detail?"},
        ]
    return bodies


def _streamed_response(pieces: int = 200) -> list[bytes]:
    created = {"type": "response.created", "response": {"id": "resp_" + "a" * 48, "model": MODEL}}
    chunks = [b"event: response.created\ndata: " + orjson.dumps(created) + b"\n\n"]
    for i in range(pieces):
        delta = {"type": "response.output_text.delta", "delta": f"word{i} ", "sequence_number": i}
        chunks.append(b"event: response.output_text.delta\ndata: " + orjson.dumps(delta) + b"\n\n")
    return chunks


async def _timed(n: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def _p50(samples: list[float]) -> float:
    return statistics.median(samples)


async def _measure(n: int, workdir: Path) -> dict[str, float]:
    store = SqliteRolloutStore(f"sqlite:///{workdir}/state.db", RolloutState())
    links = ContinuityResolver(store)
    chains = ChainMap(links)
    bodies = _chat_bodies(6)
    for turn, body in enumerate(bodies[:-1], start=1):  # turns 1-5 served and linked
        identity = await links.identify({}, body, MODEL, "chat/completions")
        assert identity.pending is not None
        answer = {"role": "assistant", "content": _answer(turn)}
        links.remember(identity.pending, {"choices": [{"message": answer}]})
    chat_body = bodies[-1]
    chained_body = {"model": MODEL, "input": "And day 6?", "previous_response_id": "resp_5"}
    chains.keep("r:resp_5", ChainEntry("h:abc", 5, "vllm"))
    await links.done()  # flushes: the store holds the id too, for the store-read case

    async def chat() -> None:
        identity = await links.identify({}, chat_body, MODEL, "chat/completions")
        route(identity.conversation, SNAPSHOT, SERVED)

    async def chained(chain_map: ChainMap = chains) -> None:
        ref = chain_ref(chained_body)
        assert ref is not None
        identity, backend = await chain_map.identify(ref)
        assert backend is not None
        stick(route(identity.conversation, SNAPSHOT, SERVED), backend)

    async def store_read() -> None:
        await chained(ChainMap(links))  # as a proxy that never saw the id

    base, new = [], []
    for _ in range(n // 100):  # interleaved, so drift from other load hits both sides alike
        base += await _timed(100, chat)
        new += await _timed(100, chained)
    figures = {
        "chat_p50_us": _p50(base),
        "chained_p50_us": _p50(new),
        "added_p50_us": _p50(new) - _p50(base),
        "chained_store_read_p50_us": _p50(await _timed(max(50, n // 20), store_read)),
    }
    stream = _streamed_response()

    async def read_id() -> None:
        assert response_id(stream) is not None

    figures["response_id_streamed_p50_us"] = _p50(await _timed(n // 5, read_id))
    rewrite = answer_model_rewrite(MODEL, "my-alias")
    assert rewrite is not None
    named, unnamed = stream[0], stream[1]

    async def splice_named() -> None:
        rewrite(named)

    async def splice_unnamed() -> None:
        rewrite(unnamed)

    figures["answer_model_named_chunk_p50_us"] = _p50(await _timed(n, splice_named))
    figures["answer_model_other_chunk_p50_us"] = _p50(await _timed(n, splice_unnamed))
    store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        figures = asyncio.run(_measure(max(100, args.requests), Path(workdir)))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"routing a chained Responses request, {args.requests} requests (microseconds)")
    for name, value in figures.items():
        print(f"  {name:34} {value:8.2f}")
    added = figures["added_p50_us"]
    verdict = "within" if added <= 100 else "OVER"
    print(f"a chained request adds {added:.1f} us p50 over a chat request: {verdict} the 100 us")


if __name__ == "__main__":
    main()
