"""`kvmigrate report` over a large records database: wall time and peak RSS.

    .venv/bin/python benchmarks/report_scale.py [--requests 200000] [--turns 10] [--db PATH]

Builds `--requests` served chat requests in a temporary SQLite records database, through
the recorder's own converter (`record.content: redacted`, each history stored once): agent
loops of `--turns` turns, `--concurrent` of them interleaved as many agents at once would
be, each request its previous one plus the answer and a new user message. One in eight
conversations stamps the time in its system prompt, one in eight reorders its tools at
turn 3, one in eight edits an earlier message at turn 4; the rest are clean.

Then, each in a fresh child process (so its peak RSS is its own, imports included):
  report   `build_report` and the text renderer, what the CLI runs
  busters  the cache-buster section alone (`kvmigrate.report.busters.cache_busters`)

`--db PATH` keeps the database (built only if PATH does not exist), so old and new code
can be timed on the same one: run from outside the repository with
`PYTHONPATH=/path/to/other/checkout` to time another checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

import kvmigrate
from kvmigrate.exchange import SERVE, Exchange
from kvmigrate.recorder.store import open_store

SYSTEM = "You are a careful coding agent. Read the repository, plan, then act. " * 20
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool: " + "it does what its name says. " * 6,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("read_file", "run_tests", "write_file", "search")
]
START = 1_700_000_000.0
BATCH = 2_000


def _body(conversation: int, turn: int, history: list[dict[str, Any]]) -> dict[str, Any]:
    kind = conversation % 8
    system = SYSTEM
    if kind == 1:  # a timestamp in the system prompt: every later turn breaks
        system = f"Current time: 2025-01-06T10:{turn:02d}:{(7 * turn) % 60:02d}Z\n{SYSTEM}"
    tools = TOOLS
    if kind == 2 and turn >= 3:  # the tools reordered once
        tools = [*TOOLS[1:], TOOLS[0]]
    messages = [dict(m) for m in history]
    if kind == 3 and turn >= 4 and len(messages) > 1:  # an earlier message edited
        messages[1]["content"] += " (edited)"
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, *messages],
        "tools": tools,
    }


def _exchange(request_id: str, conversation: int, turn: int, body: bytes, answer: str) -> Exchange:
    x = Exchange(
        request_id=request_id, route="chat/completions", backend="hosted", role=SERVE,
        model="m", served_model="m", conversation=f"conv-{conversation}", turn=turn,
        stream=False, started=0.0, request_body=body, status=200, first_byte=0.1,
        finished=0.2,
    )  # fmt: skip
    message = {"role": "assistant", "content": answer}
    x.chunks = [orjson.dumps({"choices": [{"message": message}], "usage": {"prompt_tokens": 9}})]
    return x


def build(path: str, requests: int, turns: int, concurrent: int) -> None:
    """Agent loops, `concurrent` at a time, their turns interleaved in time order."""
    from kvmigrate.recorder.convert import RecordConverter

    convert = RecordConverter("redacted", "bench")
    histories: dict[int, list[dict[str, Any]]] = {}
    pending = []
    with open_store(f"sqlite:///{path}") as store:
        for i in range(requests):
            # Round-robin over a window of `concurrent` conversations, each `turns` long.
            block, offset = divmod(i, concurrent * turns)
            turn, slot = divmod(offset, concurrent)
            conversation = block * concurrent + slot
            history = histories.setdefault(conversation, [])
            history.append({"role": "user", "content": f"Step {turn} of task {conversation}."})
            body = orjson.dumps(_body(conversation, turn + 1, history))
            answer = f"Done step {turn} of task {conversation}: looked at part {turn}."
            x = _exchange(f"r{i:08d}", conversation, turn + 1, body, answer)
            pending.append(convert((x, START + i * 0.01)))
            history.append({"role": "assistant", "content": answer})
            if turn == turns - 1:
                del histories[conversation]
            if len(pending) >= BATCH:
                store.insert(pending)
                pending = []
        store.insert(pending)


def child(path: str, what: str) -> None:
    from kvmigrate.report import RENDERERS, build_report
    from kvmigrate.report.busters import cache_busters

    until = START + 10**7
    with open_store(f"sqlite:///{path}") as store:
        start = time.perf_counter()
        if what == "report":
            report = build_report(store, START - 1, until)
            size = len(RENDERERS["text"](report))
            busters = report.cache_busters
        else:
            busters, _ = cache_busters(store, START - 1, until)
            size = 0
        wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        json.dumps(
            {
                "wall_s": wall,
                "peak_rss_mb": peak,
                "text_kb": size / 1024,
                "conversations": busters.conversations,
                "breaks": busters.breaks,
                "tokens_lost": busters.tokens_lost,
                "busters": len(busters.busters),
            }
        )
    )


def measure(path: str, what: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", what, "--db", path],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=500)
    parser.add_argument("--db", help="keep the database here (built only if missing)")
    parser.add_argument("--only", choices=("report", "busters"), action="append")
    parser.add_argument("--child", choices=("report", "busters"), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(str(args.db), args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path: str = args.db or str(Path(tmp) / "records.db")
        if not Path(path).exists():
            start = time.perf_counter()
            build(path, args.requests, args.turns, args.concurrent)
            print(f"built {args.requests:,} requests in {time.perf_counter() - start:.1f} s")
        results = {what: measure(path, what) for what in args.only or ("report", "busters")}
        size_mb = Path(path).stat().st_size / 1e6
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"records db {size_mb:,.0f} MB; code from {Path(kvmigrate.__file__ or '').parent}")
    for what, f in results.items():
        print(
            f"{what:8} wall {f['wall_s']:6.1f} s  peak RSS {f['peak_rss_mb']:6.0f} MB  "
            f"({f['conversations']:,} conversations, {f['breaks']:,} breaks, "
            f"{f['tokens_lost']:,} tokens lost, {f['busters']} busters shown)"
        )


if __name__ == "__main__":
    main()
