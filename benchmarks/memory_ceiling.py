"""The proxy's memory under large bodies and a large answer: peak and settled RSS.

    .venv/bin/python benchmarks/memory_ceiling.py [--settle 15]

A real `kvmigrate proxy` (shadow mode, recorder and cache-buster detector on, as deployed,
`max_body_bytes` 64 MiB) in front of an in-process stub upstream. Two loads, one after the
other:

1. four concurrent requests with a 30 MB body each (a pasted document in one message);
2. one streamed answer of 200 MB, read and discarded by the client.

RSS is sampled every 50 ms for the proxy's main process and for its whole process tree
(the recorder and detector workers included): the peak under load, and the level after
`--settle` seconds idle. Run it against another checkout with `PYTHONPATH=that/checkout`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import orjson
import psutil  # type: ignore[import-untyped]
from aiohttp import web

from kvmigrate.serving import BackgroundServer, free_port

MB = 1_000_000
MIB = 1024 * 1024
CHUNK = 64 * 1024
USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}}\n\n'
SMALL = orjson.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }
)


def _soak() -> object:
    spec = importlib.util.spec_from_file_location("soak", Path(__file__).with_name("soak.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module
    spec.loader.exec_module(module)
    return module


def stub_app(stream_bytes: int) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream": true' not in body and b'"stream":true' not in body:
            return web.Response(body=SMALL, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = (
            b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"w" * CHUNK + b'"}}]}\n\n'
        )
        for _ in range(stream_bytes // len(event)):
            await response.write(event)
        await response.write(USAGE + b"data: [DONE]\n\n")
        return response

    app = web.Application(client_max_size=256 * MIB)
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_get("/v1/models", lambda _r: web.json_response({"data": []}))
    return app


class Sampler:
    """RSS of a process and of its tree, sampled on a thread."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak_main = self.peak_tree = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> tuple[int, int]:
        main = self.process.memory_info().rss
        tree = main
        for child in self.process.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                tree += child.memory_info().rss
        return main, tree

    def _run(self) -> None:
        while not self._stop.is_set():
            main, tree = self.now()
            self.peak_main, self.peak_tree = max(self.peak_main, main), max(self.peak_tree, tree)
            time.sleep(0.05)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def four_large_bodies(url: str) -> list[int]:
    content = "a pasted log line 1234 " * (30 * MB // 23)
    body = orjson.dumps(
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]}
    )
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(
                url + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as r:
                await r.read()
                return r.status

        return await asyncio.gather(*(one() for _ in range(4)))


async def one_large_stream(url: str) -> tuple[int, int]:
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    received = 0
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/chat/completions", json=body) as r,
    ):
        async for chunk in r.content.iter_any():
            received += len(chunk)
        return r.status, received


def mib(value: int) -> str:
    return f"{value / MIB:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=15.0)
    parser.add_argument("--stream-mb", type=int, default=200)
    args = parser.parse_args()
    soak = _soak()
    with (
        BackgroundServer(lambda: stub_app(args.stream_mb * MB)) as stub,
        tempfile.TemporaryDirectory() as tmp,
    ):
        port = free_port()
        config = Path(tmp) / "config.yaml"
        config.write_text(f"""
server: {{port: {port}, max_body_bytes: {64 * MIB}}}
backends:
  hosted: {{api_base: "{stub.url}/v1"}}
  vllm: {{api_base: "{stub.url}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama}}
rollout: {{mode: shadow, state: "sqlite:///{tmp}/state.db"}}
record: {{db: "sqlite:///{tmp}/records.db", content: redacted}}
""")
        proxy = soak.proxy_process(config, port, Path(tmp) / "proxy.log")  # type: ignore[attr-defined]
        with proxy.start():
            time.sleep(2)  # the workers start
            sampler = Sampler(proxy.pid)
            base_main, base_tree = sampler.now()
            print(f"idle: main {mib(base_main)}, tree {mib(base_tree)}")
            rows = []
            for name, load in (
                ("4 x 30 MB bodies", four_large_bodies),
                (f"{args.stream_mb} MB streamed answer", one_large_stream),
            ):
                # The peak covers the settling too: the recorder's work starts as the
                # client's answer ends.
                with Sampler(proxy.pid) as s:
                    outcome = asyncio.run(load(proxy.url))
                    time.sleep(args.settle)
                main_after, tree_after = s.now()
                rows.append((name, outcome, s.peak_main, s.peak_tree, main_after, tree_after))
            head = ("load", "peak main", "peak tree", "settled main", "settled tree")
            print("\n{:<26} {:>10} {:>10} {:>13} {:>13}  outcome".format(*head))
            for name, outcome, pm, pt, sm, st in rows:
                shown = (
                    outcome
                    if not isinstance(outcome, tuple)
                    else f"{outcome[0]}, {outcome[1] / MB:,.0f} MB"
                )
                print(
                    f"{name:<26} {mib(pm):>10} {mib(pt):>10} {mib(sm):>13} {mib(st):>13}  {shown}"
                )


if __name__ == "__main__":
    main()
