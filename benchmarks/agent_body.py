"""What the proxy costs a request as an agent's history grows.

An agent resends its whole history every turn, so a long session's requests are 100 KB and
more, and every pass the proxy makes over a body is paid on each turn. For histories of N
turns (about 1.9 KB a turn, written as the OpenAI SDKs write them: `messages` first), the
forwarding proxy (pinned to core 0; `raw_stub.py` and `wrk` on core 1) serves non-streamed
requests at 16 connections; printed per size: req/s, the proxy's CPU a request and a KB.
With `--setup default`, the default deployment instead: every request copied to the
candidate (the same stub), the recorder and the cache-buster detector on, the CPU of their
worker processes counted with the proxy's.

Each body continues a conversation the proxy knows (a warm-up turn is answered first, and
the body resends that answer), as an agent's turns do: its identity is the in-process
link, not the store's fallback for a history nobody has seen.

With `--baseline DIR` (another checkout, e.g. `git worktree add /tmp/base HEAD~3`), that
checkout's proxy is measured too, cell by cell in turn with this one, and the ratio of
their CPU a request printed: both on the same machine's hour.

    python benchmarks/agent_body.py [--turns 0,30,60,120] [--baseline DIR] [--reps 3]
        [--setup forwarding|default]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson
from proxy_overhead import cpu_seconds, free_port, kvmigrate_config, pinned, process, stub_argv
from upstream_stub import COMPLETION

ANSWER = orjson.loads(COMPLETION)["choices"][0]["message"]["content"]
SYSTEM = "You are a careful coding agent. Current time: 2026-12-05T09:00:00Z. " * 20
# (shadow_sample, recorder and detector on), as proxy_overhead.py's kvmigrate and kv+full
SETUPS = {"forwarding": (0.0, False), "default": (1.0, True)}
TURN = "The build log shows a flaky fixture in tests/test_api.py; here is its output:\n" * 12


def conversation(turns: int) -> tuple[bytes, bytes]:
    """(the warm-up turn, the turn measured): the second resends the first and its answer."""
    history: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        history.append({"role": "user", "content": f"Turn {i}. " + TURN})
        history.append({"role": "assistant", "content": f"Answer {i}. " + TURN})
    warm_up = [*history, {"role": "user", "content": "Why does the suite fail on CI?"}]
    measured = [*warm_up, {"role": "assistant", "content": ANSWER}]
    measured.append({"role": "user", "content": "Reset it in a fixture, then run it again."})

    def body(messages: list[dict[str, str]]) -> bytes:
        return orjson.dumps({"messages": messages, "model": "gpt-4o-mini", "max_tokens": 64})

    return body(warm_up), body(measured)


def post(base: str, body: bytes) -> None:
    request = urllib.request.Request(
        base + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-client"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def rate(wrk: str, base: str, body: bytes, seconds: float) -> float:
    script = (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        'wrk.headers["Authorization"] = "Bearer sk-client"\n'
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as file:
        file.write(script)
        file.flush()
        url = base + "/v1/chat/completions"
        argv = pinned(1, [wrk, "-t1", "-c16", f"-d{seconds:g}s", "-s", file.name, url])
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if match is None or "Non-2xx" in out:
        raise RuntimeError(f"wrk:\n{out}")
    return float(match.group(1))


def cell(base: str, pid: int, wrk: str, body: bytes, seconds: float) -> tuple[float, float]:
    """(req/s, the proxy's CPU a request in us) for one body."""
    before = cpu_seconds(pid)
    served = rate(wrk, base, body, seconds)
    return served, (cpu_seconds(pid) - before) / (served * seconds) * 1e6


def measure(
    checkouts: dict[str, str], stub: str, tmp: Path, turns: int, args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """{checkout: (median req/s, median CPU us a request)} for one body, the checkouts in
    turn, their order reversed every rep."""
    wrk = shutil.which("wrk")
    assert wrk is not None
    warm_up, measured = conversation(turns)
    cells: dict[str, list[tuple[float, float]]] = {name: [] for name in checkouts}
    for rep in range(args.reps):
        for name in list(checkouts) if rep % 2 == 0 else list(reversed(checkouts)):
            port = free_port()
            cfg = tmp / f"{name}-{turns}-{rep}.yaml"
            kvmigrate_config(cfg, port, stub, *SETUPS[args.setup])
            argv = [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(cfg)]
            with process(pinned(0, argv), port, env={"PYTHONPATH": checkouts[name]}) as proc:
                base = f"http://127.0.0.1:{port}"
                post(base, warm_up)  # the answer the measured turn resends
                time.sleep(0.3)
                cells[name].append(cell(base, proc.pid, wrk, measured, args.seconds))
    return {
        name: (statistics.median(r for r, _ in got), statistics.median(us for _, us in got))
        for name, got in cells.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", default="0,30,60,120")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure in turn")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--setup", choices=tuple(SETUPS), default="forwarding")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    checkouts = {"this": os.environ.get("PYTHONPATH", "")}
    if args.baseline:
        checkouts["baseline"] = str(args.baseline.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        stub_port = free_port()
        with process(pinned(1, stub_argv(stub_port, raw=True)), stub_port):
            stub = f"http://127.0.0.1:{stub_port}"
            for turns in (int(t) for t in args.turns.split(",")):
                kib = len(conversation(turns)[1]) / 1024
                figures = measure(checkouts, stub, Path(tmp), turns, args)
                shown = "  ".join(
                    f"{name} {rps:6.0f} req/s {us:6.0f} us/req ({us / kib:5.2f} us/KB)"
                    for name, (rps, us) in figures.items()
                )
                if args.baseline:
                    ratio = figures["this"][1] / figures["baseline"][1]
                    shown += f"  this/baseline CPU {ratio:.3f}"
                print(f"{turns:4d} turns, {kib:6.1f} KB: {shown}", flush=True)


if __name__ == "__main__":
    main()
