"""Where a turn's added time goes inside the running proxy, at concurrency 1.

proxy_overhead.py says how much the proxy adds; this says where, step by step, in the
proxy as deployed (a real process, pinned to core 0, the stub and the client on core 1), not
in a loop over one function: the same code runs two to six times slower per request when
requests come one at a time than timeit says, so only marks taken in place are worth
ranking. The proxy runs with timestamps hooked onto the boundaries of its steps; each is a
median over the requests, from the moment the step's input arrived:

  request side, from the request's last bytes read (its body, for a client that sends the
  head first, as aiohttp's and httpx's do):
    read      the handler has the body (aiohttp's payload, `read_body`), to be parsed
    routed    parsed, conversation identified, rollout decided (`_route`)
    called    the upstream call built (`_call`: headers, URL, the model spliced)
    sent      the request written to the upstream socket (the pool's connection)
  (where every conversation goes to one backend, shadow mode, the call is sent before the
  conversation is identified: `called` and `sent` come before `routed`)
  and aiohttp's own share before the handler starts, from the request head's arrival
  (hidden behind the body's arrival for those clients, all of it for a client that sends
  the request in one write):
    handler   the handler entered
  answer side, from the upstream answer's bytes read:
    parsed    llhttp and the answer object have them
    relay     the handler resumed with the whole answer (`_relay`)
    written   the answer written to the client's socket

The hooks cost about a microsecond each. `added` is measured in turn with the stub (each
request to the proxy follows or precedes one straight to the stub), as proxy_overhead.py
measures its c=1 cells.

    python benchmarks/critical_path.py [--setup forwarding|recorder|default] [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import proxy_overhead as po

# name: (shadow_sample, recorder and detector on), as proxy_overhead.PROXY_SETUPS.
SETUPS = {"forwarding": (0.0, False), "recorder": (0.0, True), "default": (1.0, True)}
REQUEST_STEPS = ("read", "routed", "called", "sent")
ANSWER_STEPS = ("parsed", "relay", "written")
MARKS_ENV = "KVMIGRATE_CRITICAL_PATH_OUT"
DUMP_EVERY = 250


def serve_with_marks(argv: list[str]) -> None:
    """The proxy's CLI, with a timestamp taken at each step's boundary (this process only)."""
    from aiohttp import web_protocol

    from kvmigrate.cli import main
    from kvmigrate.proxy import client_answer, service
    from kvmigrate.proxy.client import connection

    clock = time.perf_counter_ns
    since: dict[str, int] = {"head": 0, "bytes": 0, "answer": 0}
    # The request's own upstream call, the first after its bytes (a shadow copy's goes after
    # the answer), and its connection: a copy's call and answer are not marked.
    serving: dict[str, Any] = {"call": False, "connection": None}
    spans: dict[str, list[int]] = {}

    def mark(step: str, origin: str) -> None:
        spans.setdefault(step, []).append(clock() - since[origin])

    def before(owner: Any, name: str, step: str, origin: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        async def hooked(*args: Any, **kwargs: Any) -> Any:
            mark(step, origin)
            return await original(*args, **kwargs)

        setattr(owner, name, hooked)

    received = web_protocol.RequestHandler.data_received

    def request_bytes(self: Any, data: bytes) -> None:
        now = clock()
        if not getattr(self, "_request_in_progress", False):
            since["head"] = now  # a new request's first bytes
        since["bytes"] = now
        serving["call"] = True
        received(self, data)

    web_protocol.RequestHandler.data_received = request_bytes  # type: ignore[method-assign]
    before(service.ProxyService, "handle_model_route", "handler", "head")
    parse_body = service.parse_body

    def hooked_parse(raw: bytes) -> Any:
        mark("read", "bytes")
        return parse_body(raw)

    service.parse_body = hooked_parse
    before(service.ProxyService, "_answer", "routed", "bytes")
    before(service.ProxyService, "_relay", "relay", "answer")
    build_call = service.ProxyService._call

    def hooked_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = build_call(self, *args, **kwargs)
        if serving["call"]:
            mark("called", "bytes")
        return call

    service.ProxyService._call = hooked_call  # type: ignore[method-assign]
    send = connection.Connection.send

    def hooked_send(self: Any, head: bytes, body: bytes) -> None:
        send(self, head, body)
        if serving["call"]:
            serving["call"], serving["connection"] = False, self
            mark("sent", "bytes")

    connection.Connection.send = hooked_send  # type: ignore[method-assign]
    answer_received = connection.Connection.data_received
    out = Path(os.environ[MARKS_ENV])

    def answer_bytes(self: Any, data: bytes) -> None:
        if self is not serving["connection"]:
            answer_received(self, data)
            return
        since["answer"] = clock()
        answer_received(self, data)
        mark("parsed", "answer")
        if len(spans["parsed"]) % DUMP_EVERY == 0:  # the proxy is stopped by a signal
            out.write_text(json.dumps(spans))

    connection.Connection.data_received = answer_bytes  # type: ignore[method-assign]
    written = client_answer.ClientAnswer._send

    async def hooked_written(self: Any, data: bytes) -> None:
        await written(self, data)
        mark("written", "answer")

    client_answer.ClientAnswer._send = hooked_written  # type: ignore[method-assign]
    sys.argv = ["kvmigrate", *argv]
    main()


def measure(setup: str, requests: int) -> dict[str, float]:
    sample, full = SETUPS[setup]
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        stub_port, candidate_port, port = po.free_port(), po.free_port(), po.free_port()
        stub = f"http://127.0.0.1:{stub_port}"
        cfg = tmp / "proxy.yaml"
        po.kvmigrate_config(cfg, port, stub, sample, full, f"http://127.0.0.1:{candidate_port}")
        marks = tmp / "marks.json"
        argv = [sys.executable, __file__, "--serve", "proxy", "--config", str(cfg)]
        headers = {"Authorization": "Bearer sk-stub", "Content-Type": "application/json"}
        baseline = po.Baseline(stub, headers)
        with (
            po.process(po.pinned(1, po.stub_argv(stub_port)), stub_port),
            po.process(po.pinned(1, po.stub_argv(candidate_port)), candidate_port),
            po.process(po.pinned(0, argv), port, env={MARKS_ENV: str(marks)}) as proc,
        ):
            base = f"http://127.0.0.1:{port}"
            asyncio.run(po.load("warm", base, False, 1, 500, "sk-client"))
            before = po.cpu_seconds(proc.pid)
            result = asyncio.run(
                po.load("marked", base, False, 1, requests, "sk-client", baseline=baseline)
            )
            cpu_us = (po.cpu_seconds(proc.pid) - before) / requests * 1e6
            time.sleep(0.2)
        spans: dict[str, list[int]] = json.loads(marks.read_text())
    figures = {f"{setup}.{step}_us": _median_us(spans, step) for step in spans}
    figures[f"{setup}.added_p50_ms"] = result.pct(0.5) - statistics.median(result.baseline) * 1e3
    figures[f"{setup}.proxy_tree_cpu_us"] = cpu_us
    return figures


def _median_us(spans: dict[str, list[int]], step: str) -> float:
    recent = spans[step][-5000:]  # the measured requests, not the warm-up's
    return statistics.median(recent) / 1000


def report(setup: str, figures: dict[str, float]) -> None:
    def get(step: str) -> float:
        return figures.get(f"{setup}.{step}_us", float("nan"))

    print(
        f"{setup}: adds {figures[f'{setup}.added_p50_ms']:.3f} ms p50 at c=1 (in turn); "
        f"proxy tree CPU {figures[f'{setup}.proxy_tree_cpu_us']:.0f} us/request"
    )
    print(f"  aiohttp, request head to handler       {get('handler'):6.1f} us")
    previous = 0.0
    for step in sorted(REQUEST_STEPS, key=get):  # a call sent early precedes `routed`
        print(f"  request bytes to {step:8}  {get(step):6.1f} us  (+{get(step) - previous:5.1f})")
        previous = get(step)
    previous = 0.0
    for step in ANSWER_STEPS:
        print(f"  answer bytes to {step:9}  {get(step):6.1f} us  (+{get(step) - previous:5.1f})")
        previous = get(step)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve_with_marks(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", choices=[*SETUPS, "all"], default="all")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {1})
    figures: dict[str, float] = {}
    for setup in SETUPS if args.setup == "all" else [args.setup]:
        figures |= measure(setup, args.requests)
        report(setup, figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
