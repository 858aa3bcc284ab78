"""The forward table's test bed: one scripted upstream on loopback behind every backend,
and real proxies in front of it. See test_forward_relay.py for what the rows assert."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from kvmigrate.config import parse_config
from kvmigrate.exchange import Exchange
from kvmigrate.proxy import build_proxy_app
from kvmigrate.proxy.app import SERVICE_KEY
from kvmigrate.serving import BackgroundServer

DEADLINE_S = 30.0
PRIMARY_MODEL = "gpt-4o-mini"
CANDIDATE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KEY = "sk-client"
DONE = b"data: [DONE]\n\n"
DONE_CRLF = b"data: [DONE]\r\n\r\n"
# 8 MiB, as forward.BUFFER_LIMIT: spelled out, so a change of the bound is a change here too.
BUFFER_LIMIT = 8 * 1024 * 1024
REFUSAL_KEPT = 64 * 1024
SSE = {"Content-Type": "text/event-stream"}
JSON = {"Content-Type": "application/json"}

Step = tuple[Any, ...]


@dataclass
class Reply:
    """How the upstream answers one token: `steps` in order, the head sent at ("head",)."""

    steps: list[Step]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    length: int | None = None  # a declared Content-Length; None: chunked


@dataclass
class Seen:
    who: str
    method: str
    path: str
    body: bytes


class Gate:
    """A flag the test thread sets and the upstream's handlers await."""

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._lock = threading.Lock()

    def set(self) -> None:
        with self._lock:
            self._set = True
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(waiter.set)

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        waiter = asyncio.Event()
        with self._lock:
            if self._set:
                return
            self._waiters.append((asyncio.get_running_loop(), waiter))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DEADLINE_S):
                await waiter.wait()


class Upstream:
    """The one backend behind every proxy here: it answers as the token's script says."""

    def __init__(self) -> None:
        self.replies: dict[tuple[str, str], Reply] = {}
        self.seen: list[Seen] = []
        self._gates: dict[str, Gate] = {}
        self._lock = threading.Lock()
        self.server = BackgroundServer(self._app)

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    @property
    def base(self) -> str:
        return self.server.url + "/v1"

    def script(self, token: str, who: str, reply: Reply) -> None:
        self.replies[(token, who)] = reply

    def gate(self, name: str) -> Gate:
        with self._lock:
            return self._gates.setdefault(name, Gate())

    def bodies(self, token: str, who: str) -> list[bytes]:
        return [s.body for s in self.seen if s.who == who and token.encode() in s.body]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path == "/v1/models":  # the candidate key gate asks the primary once
            return web.json_response({"object": "list", "data": []})
        if body:
            data = orjson.loads(body)
            who = "candidate" if data.get("model") == CANDIDATE_MODEL else "primary"
            token = data["messages"][-1]["content"]
        else:  # a pass-through call: /v1/files/<token>[/...]
            who, token = "primary", request.path.split("/")[3]
        self.seen.append(Seen(who, request.method, request.path, body))
        reply = self.replies.get((token, who))
        if reply is None:  # a copy no row looks at: answered at once, its connection closed
            return web.Response(body=b"{}", headers={**JSON, "Connection": "close"})
        return await self._play(request, reply)

    async def _play(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        response = web.StreamResponse(status=reply.status, headers=reply.headers)
        if reply.length is not None:
            response.content_length = reply.length
        for kind, *args in reply.steps:
            if kind == "respond":  # a whole answer, with its Content-Length
                return web.Response(status=reply.status, headers=reply.headers, body=args[0])
            if kind == "head":
                await response.prepare(request)
            elif kind == "write":
                await response.write(args[0])
            elif kind == "pieces":  # small writes, each on its own way out
                data, size, interval = args
                for at in range(0, len(data), size):
                    await response.write(data[at : at + size])
                    await asyncio.sleep(interval)
            elif kind == "gate":
                await self.gate(args[0]).wait()
            elif kind == "set":
                self.gate(args[0]).set()
            elif kind == "sleep":
                await asyncio.sleep(args[0])
            elif kind == "trickle":  # a body that never ends, nor falls silent
                data, interval = args
                for _ in range(int(2 * DEADLINE_S / interval)):
                    await response.write(data)
                    await asyncio.sleep(interval)
            elif kind == "stall":  # silent until the proxy hangs up (the handler is cancelled)
                await asyncio.sleep(DEADLINE_S)
            elif kind == "close":  # the connection ends here, whatever the framing said
                assert request.transport is not None
                request.transport.close()
                # As a cancelled handler ends: aiohttp then writes no last chunk of its own.
                raise asyncio.CancelledError
        await response.write_eof()
        return response


_tokens = itertools.count()


def new_token(name: str) -> str:
    return f"{name}-{next(_tokens)}"


class Records:
    """An addon keeping every finished exchange: what the recorder and the metrics get."""

    def __init__(self) -> None:
        self.done: list[Exchange] = []

    def exchange_done(self, exchange: Exchange) -> None:
        self.done.append(exchange)

    def one(self, match: Callable[[Exchange], bool]) -> Exchange:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            found = [x for x in list(self.done) if match(x)]
            if found:
                assert len(found) == 1, found
                return found[0]
            assert time.monotonic() < deadline, "no such exchange was recorded"
            time.sleep(0.005)

    def of(self, token: str, backend: str, role: str = "serve") -> Exchange:
        return self.one(
            lambda x: token.encode() in x.request_body and x.backend == backend and x.role == role
        )

    def by_id(self, request_id: str) -> Exchange:
        return self.one(lambda x: x.request_id == request_id)


@dataclass
class Proxy:
    server: BackgroundServer
    records: Records

    @property
    def url(self) -> str:
        return self.server.url

    def end_now(self) -> None:
        """What a second stop signal does: streams still running end at once."""
        service = self.server.app[SERVICE_KEY]
        self.server.loop.call_soon_threadsafe(service.end_now)

    def open_connections(self) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=DEADLINE_S) as answer:
            text = answer.read().decode()
        (line,) = [x for x in text.splitlines() if x.startswith("kvmigrate_open_connections ")]
        return float(line.split()[1])

    def wait_alone(self) -> None:
        """Until the proxy knows every client but the /metrics call itself has gone."""
        deadline = time.monotonic() + DEADLINE_S
        while self.open_connections() != 1:
            assert time.monotonic() < deadline, "a client connection is still open"
            time.sleep(0.005)


def proxy_config(
    upstream: Upstream,
    rollout: str,
    hosted_timeout: float = 10.0,
    vllm_timeout: float = 10.0,
    server: str = "",
) -> str:
    """`gpt-4o-mini` on the primary alone; `both` on either backend (split: the candidate
    answers, the primary is its fallback; shadow: the primary answers, the candidate gets a
    copy); `llama-only` on the candidate alone, checked and with nothing to fall back to."""
    return f"""
backends:
  hosted: {{api_base: "{upstream.base}", read_timeout: {hosted_timeout}, max_connections: 1}}
  vllm: {{api_base: "{upstream.base}", read_timeout: {vllm_timeout}, connect_timeout: 2}}
models:
  - {{model_name: {PRIMARY_MODEL}, hosted: {PRIMARY_MODEL}}}
  - {{model_name: both, hosted: {PRIMARY_MODEL}, vllm: {CANDIDATE_MODEL}}}
  - {{model_name: llama-only, vllm: {CANDIDATE_MODEL}}}
rollout: {rollout}
{server}
"""


def start_proxy(text: str) -> Proxy:
    records = Records()
    settings = parse_config(text, env={})
    server = BackgroundServer(lambda: build_proxy_app(settings, addons=[records])).start()
    return Proxy(server, records)


@contextlib.contextmanager
def running(text: str) -> Iterator[Proxy]:
    proxy = start_proxy(text)
    try:
        yield proxy
    finally:
        proxy.server.stop()


# The candidate answers every conversation of `both`, in the name the client asked for.
SPLIT = "{mode: split, percent: 100, noise_sample: 0}"
ANSWER_AS_ASKED = "server: {answer_model: requested}"
SHADOW = "{mode: shadow, noise_sample: 0}"
