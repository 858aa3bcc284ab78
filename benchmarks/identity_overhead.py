"""What conversation identity by continuity adds to routing a request, in microseconds.

Compares, on the same parsed bodies, the resolver's `identify` with what the proxy computed
before it (`conversation_key` + `turn_index`; `conversation_key` as it is now, masking the
opening's timestamps and ids):
  continuity  turn 6 of an agent whose system prompt carries the current time: one digest of
              the history already in hand plus one in-process LRU hit (the common case)
  opening     turn 1 of the same agent: the opening is masked (timestamps, ids) and hashed
  guess       turn 6 whose history matches no remembered answer (a trimming agent)
and, off the response path, what linking the answer costs once the relay has ended
(reassembling a streamed answer of about 200 chunks, then one digest update).
Target: the continuity lookup adds at most 0.1 ms p50.

    python benchmarks/identity_overhead.py [--requests 5000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.policies.conversation import conversation_key, turn_index
from kvmigrate.wire.assemble import assemble

ROUTE = "chat/completions"
SYSTEM = (
    "You are a meticulous travel-planning assistant.\n"
    "Current time: {now}\nRequest: req_{rid:012x}\n"
    + "Follow the house style: short paragraphs, concrete times, prices in euros.\n"
    * 25
)


def _answer(turn: int) -> str:
    return f"Turn {turn}: " + "visit the museum, then lunch near the river; " * 12


def _body(turn: int, now: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    system = {"role": "system", "content": SYSTEM.format(now=now, rid=turn * 7919)}
    return {"model": "gpt-4o-mini", "messages": [system, *history]}


def _conversation(turns: int) -> list[dict[str, Any]]:
    """The bodies of one agent's turns, each resending the previous answers."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Plan three days in Rome."}]
    bodies = []
    for turn in range(1, turns + 1):
        bodies.append(_body(turn, f"2026-12-01T10:{turn:02d}:07Z", list(history)))
        history += [
            {"role": "assistant", "content": _answer(turn)},
            {"role": "user", "content": f"Good. What about day {turn + 1}, in detail?"},
        ]
    return bodies


def _chat_response(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


def _sse(text: str, pieces: int = 200) -> bytes:
    step = max(1, len(text) // pieces)
    chunks = [text[i : i + step] for i in range(0, len(text), step)]
    lines = [
        b"data: "
        + orjson.dumps({"object": "chat.completion.chunk", "choices": [{"delta": {"content": c}}]})
        + b"\n\n"
        for c in chunks
    ]
    return b"".join(lines) + b"data: [DONE]\n\n"


async def _timed(n: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": statistics.median(ordered),
        "p95_us": ordered[int(len(ordered) * 0.95)],
    }


async def _measure(n: int) -> dict[str, dict[str, float]]:
    bodies = _conversation(6)
    resolver = ContinuityResolver()
    for turn, body in enumerate(bodies[:-1], start=1):  # turns 1-5 served and linked
        identity = await resolver.identify({}, body, "gpt-4o-mini", ROUTE)
        assert identity.pending is not None
        resolver.remember(identity.pending, _chat_response(_answer(turn)))
    last, first = bodies[-1], bodies[0]
    check = await resolver.identify({}, last, "gpt-4o-mini", ROUTE)
    assert check.source == "continuity", check
    stranger = json.loads(json.dumps(last))
    stranger["messages"][2]["content"] = "(a summary of earlier days)"

    async def before(body: dict[str, Any]) -> None:
        conversation_key({}, body, "gpt-4o-mini")
        turn_index(body)

    async def identify(body: dict[str, Any]) -> None:
        await resolver.identify({}, body, "gpt-4o-mini", ROUTE)

    stream = _sse(_answer(6))

    async def remember() -> None:
        response = assemble(ROUTE, stream)
        assert response is not None
        assert check.pending is not None
        resolver.remember(check.pending, response)

    figures: dict[str, dict[str, float]] = {}
    for name, body in (("continuity", last), ("opening", first), ("guess", stranger)):
        # Interleaved, so drift from other load hits both sides alike.
        base, new = [], []
        for _ in range(n // 100):
            base += await _timed(100, lambda b=body: before(b))
            new += await _timed(100, lambda b=body: identify(b))
        figures[name] = {
            "before_p50_us": statistics.median(base),
            "identify_p50_us": statistics.median(new),
            "added_p50_us": statistics.median(new) - statistics.median(base),
            "identify_p95_us": _stats(new)["p95_us"],
        }
    figures["link_streamed_answer"] = _stats(await _timed(n // 5, remember))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(_measure(max(100, args.requests)))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"conversation identity, {args.requests} requests per case (microseconds)")
    for name, f in figures.items():
        print(f"  {name:22} " + "  ".join(f"{k} {v:8.1f}" for k, v in f.items()))
    added = figures["continuity"]["added_p50_us"]
    verdict = "within" if added <= 100 else "OVER"
    print(f"continuity lookup adds {added:.1f} us p50: {verdict} the 100 us target")


if __name__ == "__main__":
    main()
