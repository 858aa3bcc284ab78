"""What the proxy adds: latency, time to first chunk, throughput, shadow cost, memory.

One run measures, against the same upstream stubs (the primary's, and a second process for
the candidate's copies):
  direct        the primary's stub itself (the baseline every figure is relative to)
  direct+copy   the stub, with each request also copied to the candidate's stub by the load
                generator: shadow mode's doubled upstream work without a proxy, so that
                `proxy_share` (kv+shadow minus this) is what the proxy itself adds
  kvmigrate     the proxy in shadow mode with shadow_sample 0 (forwarding only)
  kv+rec        kvmigrate plus the recorder and the cache-buster detector
  kv+shadow     the proxy shadowing every request to the candidate
  kv+full       kv+shadow plus the recorder and the detector: the default deployment
  ...:messages  direct and kvmigrate on Anthropic's /v1/messages, the same prompt and answer
                in that API's wire format: `messages_minus_chat` is its added p50 less chat's
  aiohttp-floor the least proxy our stack can be (benchmarks/floor_proxy.py: aiohttp server
                and client, uvloop, nothing else): what the transport costs on its own, so
                `kvmigrate` minus this is kvmigrate's own code
  lean-client-floor  the same with kvmigrate's own upstream client (kvmigrate.proxy.client)
                in place of aiohttp's: what that transport costs on its own
  nginx         nginx as a keep-alive reverse proxy with buffering off (when `nginx` is
                installed; Debian's nginx-light): what a proxy written in C adds on this
                machine, the reference for the concurrency-1 figures, where the machine's
                wake-ups and loopback hops, not the proxy's code, are most of the time
  litellm       LiteLLM's proxy (optional, --litellm), the baseline users compare us with;
                its c=64 cells are also measured in turn with each kvmigrate target's
                (`throughput_ratio_in_turn.*`, --ratio-reps), as the machine's speed drifts
                between cells minutes apart
Streamed figures are the time to the first chunk with non-empty `delta.content` (the stub
sends the role chunk first, then one write per content chunk, as an engine does).

The proxy under test is pinned to core 0; the stubs and this load generator to core 1.
Figures are ratios and differences against `direct` measured in the same run, never
absolute targets, so they mean the same on any machine. At concurrency 1 the direct stub is
also measured in turn with each proxy, request by request (its copy to the candidate too,
for a shadowing target): `TARGET.MODE.c1.added_interleaved_p50_ms` is the added p50 with
the machine's drift between cells taken out, and for a shadowing target
`TARGET.MODE.c1.share_interleaved_p50_ms` its share over `direct+copy` (`--no-interleave`
skips them). `--workers 1,2` adds the multi-process cell: the forwarding proxy unpinned
with `--workers N`, non-streamed req/s at 64 connections from `wrk` (when installed), and
the p50 it adds at concurrency 1 behind an upstream that answers at once and one that takes
5 ms (the default deployment runs a worker per core; the workers share their conversation
links through a table in memory). On a machine with as many cores as workers the load
generator and the stub take cores from the workers, so N workers cannot reach N times one;
`workersN.ceiling_vs_workers1` is what they could reach, from the CPU each request costs
the proxy, the stub and the load generator: cores / (proxy + stub + load) per request, over
one worker's rate (never more than N); `workersN.of_ceiling` is the share of it reached.

    python benchmarks/proxy_overhead.py                 # kvmigrate only
    python benchmarks/proxy_overhead.py --litellm       # also LiteLLM (installed into a cache venv)
    python benchmarks/proxy_overhead.py --targets direct,kvmigrate --concurrency 1
    python benchmarks/proxy_overhead.py --targets direct --workers 1,2

Against another checkout: `cd /tmp && PYTHONPATH=/path/to/it python .../proxy_overhead.py`.
Run from a neutral directory: `python -m kvmigrate` puts the working directory first on
sys.path, so from inside a checkout the proxy is that checkout's whatever PYTHONPATH says.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
LITELLM_VERSION = "1.108.7"  # known good; never 1.107.0, which was compromised on PyPI
LITELLM_VENV = Path.home() / ".cache" / "kvmigrate" / f"litellm-{LITELLM_VERSION}"
BODY = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are a careful coding agent. " * 40},
        {"role": "user", "content": "The test suite fails on CI but passes locally. Why?"},
    ],
    "max_tokens": 64,
}
# Anthropic's Messages API on the same model and prompt: its cell differs from chat's only
# in the route (and so in the identity adapter and error envelope it selects).
MESSAGES_BODY = {
    "model": "gpt-4o-mini",
    "system": BODY["messages"][0]["content"],  # type: ignore[index]
    "messages": [BODY["messages"][1]],  # type: ignore[index]
    "max_tokens": 64,
}
ROUTES = {"chat": ("/v1/chat/completions", BODY), "messages": ("/v1/messages", MESSAGES_BODY)}


# name: (shadow_sample, recorder and detector on). kv+full is the default deployment.
PROXY_SETUPS = {
    "kvmigrate": (0.0, False),
    "kv+rec": (0.0, True),
    "kv+shadow": (1.0, False),
    "kv+full": (1.0, True),
}
PROXIES = tuple(PROXY_SETUPS)
SHADOWED = ("kv+shadow", "kv+full")
FLOOR, LEAN, NGINX = "aiohttp-floor", "lean-client-floor", "nginx"
TARGETS = ("direct", "direct+copy", NGINX, FLOOR, LEAN, *PROXIES, "litellm")


def percentile_ms(latencies: list[float], q: float) -> float:
    data = sorted(latencies)
    return data[min(len(data) - 1, int(q * len(data)))] * 1000 if data else float("nan")


@dataclass(frozen=True)
class Baseline:
    """The direct stub, measured in turn with a target at concurrency 1; `copy_to`: the
    candidate stub, for a target that copies each request there (shadow)."""

    url: str
    headers: dict[str, str]
    copy_to: str = ""


@dataclass
class Result:
    target: str
    mode: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    wall: float = 0.0
    cpu_us: float = float("nan")  # CPU time of the proxy's processes per request
    # What the proxy reports it added itself (x-kvmigrate-overhead-ms): the client's clock
    # also counts the load generator's scheduling, which swamps 0.1 ms on a busy machine.
    reported: list[float] = field(default_factory=list)
    # The memory of the process tree under test after its cells (recorder and detector
    # workers included): RSS counts a page shared by two processes twice, PSS splits it.
    rss_kib: int = 0
    pss_kib: int = 0
    # At concurrency 1, the direct stub's latencies measured in turn with this target's,
    # request by request (`load`'s `baseline`): both see the machine in the same state.
    baseline: list[float] = field(default_factory=list)

    def pct(self, q: float) -> float:
        return percentile_ms(self.latencies, q)

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.wall if self.wall else 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pinned(core: int, argv: list[str]) -> list[str]:
    return (["taskset", "-c", str(core)] if shutil.which("taskset") else []) + argv


@contextmanager
def process(
    argv: list[str], port: int, env: dict[str, str] | None = None, timeout: float = 60.0
) -> Iterator[subprocess.Popen[bytes]]:
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"{argv[:4]} exited:\n{log.read().decode()[-3000:]}")
                with socket.socket() as sock:
                    if sock.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{argv[:4]} did not listen on {port}")
                time.sleep(0.1)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def kvmigrate_config(
    path: Path, port: int, stub: str, shadow_sample: float, full: bool, candidate: str = ""
) -> None:
    """`full`: the recorder and the cache-buster detector on, as deployed by default; else
    forwarding alone, which is what the latency targets are about."""
    flag = "true" if full else "false"
    tmp = path.parent
    path.write_text(f"""
server: {{host: 127.0.0.1, port: {port}}}
backends:
  hosted: {{api_base: "{stub}/v1"}}
  vllm: {{api_base: "{candidate or stub}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama}}
  - {{model_name: slow-stream, hosted: slow-stream, vllm: slow-stream}}
rollout:
  mode: shadow
  shadow_sample: {shadow_sample}
  shadow_max_concurrency: 256
  noise_sample: 0
  state: "sqlite:///{tmp}/{path.stem}-state.db"
record: {{enabled: {flag}, db: "sqlite:///{tmp}/{path.stem}-records.db"}}
cachecheck: {{enabled: {flag}}}
""")


def nginx_config(path: Path, port: int, stub: str) -> None:
    """One process (no master), keep-alive upstream connections, and no buffering, so that a
    streamed chunk is relayed as it arrives: nginx set up as a proxy for LLM traffic is."""
    upstream = stub.removeprefix("http://")
    path.write_text(f"""
daemon off;
master_process off;
error_log stderr warn;
pid {path.parent}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {path.parent}/nginx-body;
  proxy_temp_path {path.parent}/nginx-proxy;
  upstream stub {{ server {upstream}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://stub;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
""")


def litellm_config(path: Path, stub: str) -> None:
    entries = "".join(
        f"""
  - model_name: {name}
    litellm_params: {{model: openai/{name}, api_base: "{stub}/v1", api_key: sk-stub}}"""
        for name in ("gpt-4o-mini", "slow-stream")
    )
    path.write_text(f"model_list:{entries}\ngeneral_settings: {{master_key: sk-bench}}\n")


def ensure_litellm() -> Path:
    ready = LITELLM_VENV / ".kvmigrate-ready"
    if not ready.exists():
        print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run(
            [
                str(LITELLM_VENV / "bin" / "pip"),
                "install",
                "-q",
                f"litellm[proxy]=={LITELLM_VERSION}",
            ],
            check=True,
        )
        ready.touch()
    return LITELLM_VENV / "bin" / "litellm"


# A chunk whose delta carries text: the first one is what a user sees, after the role chunk.
# Anthropic's: the first text_delta with text.
CONTENT = re.compile(rb'"content":"[^"]|"text_delta","text":"[^"]')


async def one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    stream: bool,
    headers: dict[str, str],
    reported: list[float] | None = None,
) -> float:
    """Latency of a whole answer, or for a stream the time to its first non-empty content
    delta (not its first bytes: an engine sends the role chunk first)."""
    start = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"status {response.status}")
        overhead = response.headers.get("x-kvmigrate-overhead-ms")
        if reported is not None and overhead is not None:
            reported.append(float(overhead))
        if not stream:
            await response.read()
            return time.perf_counter() - start
        elapsed = None
        seen = b""
        async for chunk in response.content.iter_any():
            if elapsed is None:
                seen = seen[-64:] + chunk  # a marker split across two reads
                if CONTENT.search(seen):
                    elapsed = time.perf_counter() - start
        if elapsed is None:
            raise RuntimeError("no content in the stream")
        return elapsed


async def copy(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> None:
    async with session.post(url, data=body, headers=headers) as response:
        await response.read()


async def load(
    target: str,
    base: str,
    stream: bool,
    concurrency: int,
    total: int,
    key: str,
    copy_to: str = "",
    route: str = "chat",
    baseline: Baseline | None = None,
) -> Result:
    """`copy_to`: after each answer, send the same request there too and drain it in the
    background, as shadow mode makes the proxy do (the doubled upstream work, no proxy).
    `baseline` (concurrency 1): each request to the target follows or precedes one to the
    baseline, in turn, so that drift in the machine's speed between cells (on this VM
    a tenth of a millisecond within minutes) falls on both alike."""
    path, template = ROUTES[route]
    body = json.dumps({**template, "stream": stream}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    label = target if route == "chat" else f"{target}:{route}"
    result = Result(label, "stream" if stream else "plain", concurrency)
    url = base + path
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(min(50, total)):  # warm the pools
            await one(session, url, body, stream, headers)

        copies: set[asyncio.Task[None]] = set()

        def copy_soon(to: str, copy_headers: dict[str, str]) -> None:
            task = asyncio.ensure_future(copy(session, to, body, copy_headers))
            copies.add(task)
            task.add_done_callback(copies.discard)

        async def on_baseline() -> float:
            assert baseline is not None
            start = time.perf_counter()
            try:
                elapsed = await one(session, baseline.url + path, body, stream, baseline.headers)
                result.baseline.append(elapsed)
            except (TimeoutError, aiohttp.ClientError, RuntimeError):
                pass  # the stub's own failure: no baseline figure for this turn
            if baseline.copy_to:
                copy_soon(baseline.copy_to + path, baseline.headers)
            return time.perf_counter() - start

        async def worker(n: int) -> float:
            """The time spent on the baseline's requests, not the target's."""
            aside = 0.0
            for i in range(n):
                if baseline is not None and i % 2 == 0:
                    aside += await on_baseline()
                try:
                    elapsed = await one(session, url, body, stream, headers, result.reported)
                    result.latencies.append(elapsed)
                except (TimeoutError, aiohttp.ClientError, RuntimeError):
                    result.errors += 1
                if copy_to:
                    copy_soon(copy_to, headers)
                if baseline is not None and i % 2 == 1:
                    aside += await on_baseline()
            return aside

        start = time.perf_counter()
        asides = await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
        result.wall = time.perf_counter() - start - sum(asides) / concurrency
        await asyncio.gather(*copies, return_exceptions=True)
    return result


async def open_streams(base: str, count: int, key: str, pid: int) -> tuple[int, int]:
    """Hold `count` streams open through the proxy; return (streams open, proxy RSS in KiB)."""
    body = json.dumps({**BODY, "model": "slow-stream", "stream": True}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        responses = await asyncio.gather(
            *(
                session.post(base + "/v1/chat/completions", data=body, headers=headers)
                for _ in range(count)
            ),
            return_exceptions=True,
        )
        opened = [r for r in responses if isinstance(r, aiohttp.ClientResponse)]
        await asyncio.gather(*(r.content.readany() for r in opened), return_exceptions=True)
        await asyncio.sleep(1.0)
        rss = rss_kib(pid)
        for response in opened:
            response.close()
    return len(opened), rss


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tree_memory_kib(pid: int) -> tuple[int, int]:
    """RSS and PSS of a process and its children, summed."""
    import psutil

    rss = pss = 0
    try:
        process = psutil.Process(pid)
        tree = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for member in tree:
        try:
            info = member.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return rss // 1024, pss // 1024


def cpu_seconds(pid: int | None) -> float:
    """User and system CPU time of a process and its children (the recorder's and the
    detector's workers): robust where wall-clock figures are not, on a shared machine."""
    if pid is None:
        return float("nan")
    import psutil

    try:
        process = psutil.Process(pid)
        tree = [process, *process.children(recursive=True)]
        return sum(t.user + t.system for t in (p.cpu_times() for p in tree))
    except psutil.Error:
        return float("nan")


def settle(pid: int, base: str, key: str, timeout: float = 20.0) -> None:
    """Wait until a freshly started proxy is quiet: its recorder's and detector's workers
    start with the first requests and spend a second or more of CPU importing, which the
    first cell's CPU per request counted (a quarter to a half of it at concurrency 1)."""
    asyncio.run(load("warm-up", base, False, 1, 20, key))
    deadline = time.monotonic() + timeout
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = cpu_seconds(pid)
        if now - last < 0.025:  # under 5% of a core: idle
            return
        last = now


def run_target(
    name: str,
    base: str,
    key: str,
    args: argparse.Namespace,
    copy_to: str = "",
    pid: int | None = None,
    route: str = "chat",
    memory_of: int | None = None,
    baseline: Baseline | None = None,
) -> list[Result]:
    """Every cell of one target; `memory_of`: the process whose tree's memory is reported
    (the target's own, `pid`, unless given); `baseline`: measured in turn with the target
    in its concurrency-1 cells."""
    results = []
    if pid is not None:
        settle(pid, base, key)
    for stream in (False, True):
        for concurrency in args.concurrency:
            total = max(args.requests, concurrency * 10)
            if name == "litellm":
                total = min(total, args.litellm_requests)
            before = cpu_seconds(pid)
            paired = baseline if concurrency == 1 else None
            result = asyncio.run(
                load(name, base, stream, concurrency, total, key, copy_to, route, paired)
            )
            served = len(result.latencies) + result.errors + min(50, total)  # with warm-up
            result.cpu_us = (cpu_seconds(pid) - before) / served * 1e6
            results.append(result)
            print(
                f"  {result.target:18} {result.mode:6} c={concurrency:<3}"
                f" p50 {result.pct(0.5):7.2f} ms"
                f"  p99 {result.pct(0.99):7.2f} ms  {result.rps:8.0f} req/s"
                f"  proxy CPU {result.cpu_us:6.0f} us/req  errors {result.errors}",
                flush=True,
            )
    measured = memory_of or pid
    if measured is not None:
        rss, pss = tree_memory_kib(measured)
        print(f"  process tree after the load: RSS {rss / 1024:.0f} MiB, PSS {pss / 1024:.0f} MiB")
        for result in results:
            result.rss_kib, result.pss_kib = rss, pss
    return results


def summary(results: list[Result], memory: tuple[int, int] | None) -> dict[str, float]:
    def get(target: str, mode: str, c: int) -> Result | None:
        return next(
            (r for r in results if (r.target, r.mode, r.concurrency) == (target, mode, c)), None
        )

    figures: dict[str, float] = {}
    for target in ("direct+copy", NGINX, FLOOR, LEAN, *PROXIES, "litellm"):
        for mode in ("plain", "stream"):
            for c in (1, 16, 64):
                base, res = get("direct", mode, c), get(target, mode, c)
                if base and res and res.latencies:
                    figures[f"{target}.{mode}.c{c}.added_p50_ms"] = res.pct(0.5) - base.pct(0.5)
                    figures[f"{target}.{mode}.c{c}.added_p99_ms"] = res.pct(0.99) - base.pct(0.99)
                    figures[f"{target}.{mode}.c{c}.rps"] = res.rps
                    if res.cpu_us == res.cpu_us:  # measured (not NaN)
                        figures[f"{target}.{mode}.c{c}.proxy_cpu_us"] = res.cpu_us
                    if res.reported:  # the proxy's own clock: request in to answer out
                        figures[f"{target}.{mode}.c{c}.reported_p50_ms"] = statistics.median(
                            res.reported
                        )
                if res and res.latencies and res.baseline:  # the stub, measured in turn
                    # Shadowing: over direct+copy, the proxy's share (below) interleaved.
                    name = "share" if target in SHADOWED else "added"
                    figures[f"{target}.{mode}.c{c}.{name}_interleaved_p50_ms"] = res.pct(
                        0.5
                    ) - percentile_ms(res.baseline, 0.5)
                # Shadow's cost beyond the doubled upstream work: the proxy's own share.
                doubled = get("direct+copy", mode, c)
                if target in SHADOWED and doubled and res and res.latencies:
                    figures[f"{target}.{mode}.c{c}.proxy_share_p50_ms"] = res.pct(
                        0.5
                    ) - doubled.pct(0.5)
    for target in PROXIES:
        for mode in ("plain", "stream"):
            for c in (16, 64):
                kv, lite = get(target, mode, c), get("litellm", mode, c)
                if kv and lite and lite.rps:
                    figures[f"throughput_ratio.{target}.{mode}.c{c}"] = kv.rps / lite.rps
    # kvmigrate's own code: forwarding's added time less the bare transport's.
    for mode in ("plain", "stream"):
        for c in (1, 16, 64):
            kv, floor = get("kvmigrate", mode, c), get(FLOOR, mode, c)
            if kv and floor and kv.latencies and floor.latencies:
                figures[f"own_code.{mode}.c{c}.p50_ms"] = kv.pct(0.5) - floor.pct(0.5)
    # kvmigrate against a proxy in C on the same machine: at concurrency 1 the machine's
    # wake-ups are most of either's added time, so this difference is what our stack adds.
    for target in PROXIES:
        for mode in ("plain", "stream"):
            for c in (1, 16, 64):
                kv, ref = get(target, mode, c), get(NGINX, mode, c)
                if kv and ref and kv.latencies and ref.latencies:
                    figures[f"over_nginx.{target}.{mode}.c{c}.p50_ms"] = kv.pct(0.5) - ref.pct(0.5)
    figures |= messages_figures(figures, get)
    kv1, sh1 = get("kvmigrate", "plain", 1), get("kv+shadow", "plain", 1)
    if kv1 and sh1:
        figures["shadow_extra_p50_ms"] = sh1.pct(0.5) - kv1.pct(0.5)
    for result in results:
        if result.rss_kib and ":" not in result.target:
            figures[f"{result.target}.tree_rss_mib"] = result.rss_kib / 1024
            figures[f"{result.target}.tree_pss_mib"] = result.pss_kib / 1024
    if memory:
        figures["open_streams"], figures["rss_mib_with_open_streams"] = memory[0], memory[1] / 1024
    return figures


def main() -> None:
    args = parse_args()
    if shutil.which("taskset"):
        os.sched_setaffinity(0, {1})
    stub_port, candidate_port = free_port(), free_port()
    stub = f"http://127.0.0.1:{stub_port}"
    candidate = f"http://127.0.0.1:{candidate_port}"
    results: list[Result] = []
    memory = None
    stub_headers = {"Authorization": "Bearer sk-stub", "Content-Type": "application/json"}
    plain = Baseline(stub, stub_headers) if args.interleave else None
    # A shadowed target copies each request to the candidate: so does its baseline.
    shadowed = Baseline(stub, stub_headers, candidate) if args.interleave else None
    with (
        tempfile.TemporaryDirectory() as tmp,
        process(pinned(1, stub_argv(stub_port)), stub_port) as stub_proc,
        process(pinned(1, stub_argv(candidate_port)), candidate_port),
    ):
        if "direct" in args.targets:
            print("direct (stub)", flush=True)
            results += run_target("direct", stub, "sk-stub", args, memory_of=stub_proc.pid)
            if args.messages:
                results += run_target("direct", stub, "sk-stub", args, route="messages")
        if "direct+copy" in args.targets:
            print("direct+copy (stub, and a copy of each request to the candidate stub)")
            copy_to = candidate + "/v1/chat/completions"
            results += run_target("direct+copy", stub, "sk-stub", args, copy_to)
        if NGINX in args.targets and not shutil.which("nginx"):
            print("nginx: not installed, skipped (Debian: apt-get install nginx-light)")
        if NGINX in args.targets and shutil.which("nginx"):
            port = free_port()
            cfg = Path(tmp) / "nginx.conf"
            nginx_config(cfg, port, stub)
            argv = [str(shutil.which("nginx")), "-p", tmp, "-c", str(cfg), "-e", "stderr"]
            with process(pinned(0, argv), port) as proc:
                print("nginx (a proxy in C, the reference)", flush=True)
                base = f"http://127.0.0.1:{port}"
                results += run_target(NGINX, base, "sk-stub", args, pid=proc.pid, baseline=plain)
        for name, client in ((FLOOR, "aiohttp"), (LEAN, "lean")):
            if name not in args.targets:
                continue
            port = free_port()
            argv = [sys.executable, str(HERE / "floor_proxy.py"), "--port", str(port)]
            argv += ["--upstream", stub, "--client", client]
            with process(pinned(0, argv), port) as proc:
                print(f"{name} (the transport alone)", flush=True)
                base = f"http://127.0.0.1:{port}"
                results += run_target(name, base, "sk-client", args, pid=proc.pid, baseline=plain)
        for name in (t for t in PROXIES if t in args.targets):
            sample, full = PROXY_SETUPS[name]
            port = free_port()
            cfg = Path(tmp) / f"{name.replace('+', '-')}.yaml"
            kvmigrate_config(cfg, port, stub, sample, full, candidate)
            with process(pinned(0, proxy_argv(cfg, workers=1)), port) as proc:
                print(name, flush=True)
                base = f"http://127.0.0.1:{port}"
                paired = shadowed if name in SHADOWED else plain
                results += run_target(name, base, "sk-client", args, pid=proc.pid, baseline=paired)
                if name == "kvmigrate" and args.messages:
                    results += run_target(
                        name, base, "sk-client", args, pid=proc.pid, route="messages"
                    )
                if name == "kvmigrate" and args.streams:
                    memory = asyncio.run(open_streams(base, args.streams, "sk-client", proc.pid))
                    print(f"  {memory[0]} open streams: proxy RSS {memory[1] / 1024:.1f} MiB")
        if "litellm" in args.targets:
            results += run_litellm(Path(tmp), stub, args)
        figures = summary(results, memory)
        if "litellm" in args.targets and args.ratio_reps:
            figures |= ratios_in_turn(Path(tmp), stub, candidate, args)
        if args.workers:
            figures |= workers_cell(Path(tmp), args)
            figures |= workers_latency_cell(Path(tmp), args)
    print("\nsummary (differences and ratios against the direct baseline of this run):")
    for name, value in figures.items():
        print(f"  {name:45} {value:10.3f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


def messages_figures(
    figures: dict[str, float], get: Callable[[str, str, int], Result | None]
) -> dict[str, float]:
    """/v1/messages against chat on the same proxy: #18's target is within 0.1 ms p50."""
    found: dict[str, float] = {}
    for mode in ("plain", "stream"):
        for c in (1, 16, 64):
            chat = figures.get(f"kvmigrate.{mode}.c{c}.added_p50_ms")
            base, res = get("direct:messages", mode, c), get("kvmigrate:messages", mode, c)
            if chat is not None and base and res and res.latencies:
                added = res.pct(0.5) - base.pct(0.5)
                found[f"kvmigrate:messages.{mode}.c{c}.added_p50_ms"] = added
                found[f"messages_minus_chat.{mode}.c{c}.added_p50_ms"] = added - chat
            chat_res = get("kvmigrate", mode, c)
            if chat_res and chat_res.reported and res and res.reported:
                own = statistics.median(res.reported) - statistics.median(chat_res.reported)
                found[f"messages_minus_chat.{mode}.c{c}.reported_p50_ms"] = own
    return found


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="requests per cell")
    parser.add_argument("--concurrency", type=_ints, default=[1, 16, 64])
    parser.add_argument(
        "--targets",
        type=lambda s: s.split(","),
        default=[t for t in TARGETS if t != "litellm"],
        help=f"comma-separated, of {', '.join(TARGETS)}",
    )
    parser.add_argument("--litellm", action="store_true", help="also measure LiteLLM's proxy")
    parser.add_argument(
        "--no-messages",
        dest="messages",
        action="store_false",
        help="skip the Anthropic /v1/messages cells (direct and kvmigrate, beside chat's)",
    )
    parser.add_argument(
        "--no-interleave",
        dest="interleave",
        action="store_false",
        help="measure the direct stub only in its own cells, not also in turn with each "
        "target's concurrency-1 cells (`TARGET.MODE.c1.added_interleaved_p50_ms`)",
    )
    parser.add_argument("--litellm-requests", type=int, default=600)
    parser.add_argument(
        "--ratio-reps",
        type=int,
        default=5,
        help="with --litellm: reps of the c=64 cells that measure LiteLLM and each kvmigrate "
        "target in turn (`throughput_ratio_in_turn.*`; 0: skip)",
    )
    parser.add_argument("--streams", type=int, default=1000, help="open streams for the RSS test")
    parser.add_argument(
        "--workers",
        type=_ints,
        default=[],
        help="also compare `proxy --workers N` for these N (e.g. 1,2): non-streamed req/s at "
        "c=64, unpinned, with wrk when installed",
    )
    parser.add_argument("--workers-seconds", type=float, default=5.0)
    parser.add_argument(
        "--workers-stub",
        choices=("c", "python"),
        default="c",
        help="the --workers cell's upstream: c_stub.c (built with cc, when there is one) "
        "or raw_stub.py",
    )
    parser.add_argument("--json", type=Path, help="write all figures here")
    args = parser.parse_args()
    if args.litellm and "litellm" not in args.targets:
        args.targets.append("litellm")
    return args


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def stub_argv(port: int, raw: bool = False, delay_ms: float = 0.0) -> list[str]:
    """`raw`: the cheapest stub (non-streamed answers only), for the --workers cell;
    `delay_ms`: it answers that much later, as an engine would."""
    script = "raw_stub.py" if raw else "upstream_stub.py"
    argv = [sys.executable, str(HERE / script), "--port", str(port)]
    return [*argv, "--delay-ms", str(delay_ms)] if delay_ms else argv


def proxy_argv(cfg: Path, workers: int) -> list[str]:
    argv = [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(cfg)]
    if workers == 1 and not has_workers_option():
        return argv  # an older kvmigrate (A/B runs against another checkout): one process
    return [*argv, "--workers", str(workers)]


@functools.cache
def has_workers_option() -> bool:
    help_text = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "proxy", "--help"], capture_output=True, text=True
    ).stdout
    return "--workers" in help_text


@contextmanager
def litellm_proxy(tmp: Path, stub: str) -> Iterator[tuple[str, int]]:
    """LiteLLM's proxy, one worker, pinned as ours are: its base URL and pid."""
    litellm = ensure_litellm()
    cfg = tmp / "litellm.yaml"
    litellm_config(cfg, stub)
    port = free_port()
    argv = [str(litellm), "--config", str(cfg), "--port", str(port), "--num_workers", "1"]
    env = {
        "LITELLM_MASTER_KEY": "sk-bench",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "true",
    }
    with process(pinned(0, argv), port, env=env, timeout=180) as proc:
        yield f"http://127.0.0.1:{port}", proc.pid


def run_litellm(tmp: Path, stub: str, args: argparse.Namespace) -> list[Result]:
    with litellm_proxy(tmp, stub) as (base, pid):
        print("litellm", flush=True)
        return run_target("litellm", base, "sk-bench", args, pid=pid)


def quiet(pids: list[int], timeout: float = 10.0) -> None:
    """Until these process trees are idle (under 4% of a core over a quarter second): what
    the last cell left running (a recorder writing what it received, links being saved)
    then costs the next cell nothing, whichever target either was."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = sum(cpu_seconds(pid) for pid in pids)
        time.sleep(0.25)
        if sum(cpu_seconds(pid) for pid in pids) - before < 0.01:
            return


def ratios_in_turn(
    tmp: Path, stub: str, candidate: str, args: argparse.Namespace
) -> dict[str, float]:
    """The c=64 throughput of each kvmigrate target over LiteLLM's, measured in turn.

    Measured in cells of their own, minutes apart, the two sides of a ratio see different
    machines: on this VM the CPU a request costs moves by half within minutes, LiteLLM's
    and ours alike (62-101 req/s for LiteLLM, 1,489-2,631 for the default deployment, in
    one experiment's alternating cells). Here every process stays up (idle ones cost next
    to nothing, and each cell waits until the last one's background work is done) and each
    rep measures LiteLLM and every target back to back, in an order that reverses every
    rep; `throughput_ratio_in_turn.TARGET.MODE.c64` is the median of the reps' ratios, as
    the concurrency-1 cells take the direct stub in turn."""
    names = [n for n in PROXIES if n in args.targets]
    ratios: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        lite_base, lite_pid = stack.enter_context(litellm_proxy(tmp, stub))
        settle(lite_pid, lite_base, "sk-bench")
        bases, pids = {}, [lite_pid]
        for name in names:
            sample, full = PROXY_SETUPS[name]
            port = free_port()
            cfg = tmp / f"in-turn-{name.replace('+', '-')}.yaml"
            kvmigrate_config(cfg, port, stub, sample, full, candidate)
            proc = stack.enter_context(process(pinned(0, proxy_argv(cfg, workers=1)), port))
            bases[name] = f"http://127.0.0.1:{port}"
            settle(proc.pid, bases[name], "sk-client")
            pids.append(proc.pid)
        print(f"in turn with litellm, c=64, {args.ratio_reps} reps", flush=True)
        for rep in range(args.ratio_reps):
            for stream in (False, True):
                mode = "stream" if stream else "plain"
                order = ["litellm", *names] if rep % 2 == 0 else [*names, "litellm"]
                rates, errors = {}, 0
                for name in order:
                    base, key = (
                        (lite_base, "sk-bench") if name == "litellm" else (bases[name], "sk-client")
                    )
                    total = args.litellm_requests if name == "litellm" else max(args.requests, 640)
                    quiet(pids)
                    result = asyncio.run(load(name, base, stream, 64, total, key))
                    rates[name], errors = result.rps, errors + result.errors
                for name in names:
                    ratio = rates[name] / rates["litellm"] if rates["litellm"] else float("nan")
                    figure = f"throughput_ratio_in_turn.{name}.{mode}.c64"
                    ratios.setdefault(figure, []).append(ratio)
                shown = "  ".join(f"{n} {r:6.0f}" for n, r in rates.items())
                print(f"  rep {rep} {mode:6} req/s: {shown}  errors {errors}", flush=True)
    return {name: statistics.median(values) for name, values in ratios.items()}


def workers_cell(tmp: Path, args: argparse.Namespace) -> dict[str, float]:
    """Non-streamed req/s of the forwarding proxy with --workers N, alternating the N's
    WORKERS_REPS times (a median of three outlasts one slow cell); the medians and their
    ratios to N=1, and the CPU per request of the proxy's processes and of the stub. The
    stub is the cheapest one (`cheapest_stub_argv`; aiohttp's server cost the second
    worker's core as much as the worker did). Nothing here is pinned: this process's own pinning
    (core 1), which children inherit, is undone for the stub, the proxy and wrk, or
    every worker would share one core."""
    rates: dict[int, list[float]] = {n: [] for n in args.workers}
    cpu: dict[str, list[float]] = {}
    stub_port = free_port()
    argv = cheapest_stub_argv(tmp, stub_port, args.workers_stub)
    with unpinned(), process(argv, stub_port) as stub_proc:
        stub = f"http://127.0.0.1:{stub_port}"
        for _rep in range(WORKERS_REPS):
            for n in args.workers:
                port = free_port()
                cfg = tmp / f"workers-{n}.yaml"
                kvmigrate_config(cfg, port, stub, 0.0, False)
                with process(proxy_argv(cfg, n), port) as proc:
                    time.sleep(1.0)  # every worker listening, not only the first
                    before = (
                        cpu_seconds(proc.pid),
                        cpu_seconds(stub_proc.pid),
                        children_cpu_seconds(),
                    )
                    rate = request_rate(f"http://127.0.0.1:{port}", args.workers_seconds)
                    after = (
                        cpu_seconds(proc.pid),
                        cpu_seconds(stub_proc.pid),
                        children_cpu_seconds(),
                    )
                served = rate * args.workers_seconds
                proxy_us, stub_us, load_us = (
                    (a - b) / served * 1e6 for a, b in zip(after, before, strict=True)
                )
                rates[n].append(rate)
                for part, us in (("proxy", proxy_us), ("stub", stub_us), ("load", load_us)):
                    cpu.setdefault(f"workers{n}.plain.c64.{part}_cpu_us", []).append(us)
                print(
                    f"  workers={n}: {rate:8.0f} req/s non-streamed c=64"
                    f"  proxy CPU {proxy_us:5.0f} us/req  stub CPU {stub_us:4.0f} us/req"
                    f"  load generator CPU {load_us:4.0f} us/req",
                    flush=True,
                )
    figures = {f"workers{n}.plain.c64.rps": statistics.median(r) for n, r in rates.items()}
    figures |= {name: statistics.median(values) for name, values in cpu.items()}
    one = figures.get("workers1.plain.c64.rps")
    for n in args.workers:
        if one and n != 1:
            figures[f"workers{n}.vs_workers1"] = figures[f"workers{n}.plain.c64.rps"] / one
            figures |= _ceiling(figures, n, one)
    return figures


def cheapest_stub_argv(tmp: Path, port: int, kind: str) -> list[str]:
    """The --workers cell's stub: c_stub.c, built here with the C compiler, which costs the
    cores a third of raw_stub.py's CPU a request (the workers' ceiling on a 2-core machine
    is set by what the stub and wrk take); raw_stub.py where there is no compiler, or with
    `--workers-stub python`. Both answer with raw_stub's bytes."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if kind == "python" or compiler is None:
        return stub_argv(port, raw=True)
    binary, answer = tmp / "c_stub", tmp / "c_stub_answer.http"
    if not binary.exists():
        build = [compiler, "-O2", "-o", str(binary), str(HERE / "c_stub.c")]
        subprocess.run(build, check=True, capture_output=True)
        answer.write_bytes(raw_stub_response())
    return [str(binary), str(port), str(answer)]


def raw_stub_response() -> bytes:
    from raw_stub import RESPONSE  # this script's directory is first on sys.path

    return RESPONSE


ENGINE_DELAYS_MS = (0.0, 5.0)
WORKERS_REPS = 3


@contextmanager
def unpinned() -> Iterator[None]:
    """This process's own pinning (core 1), which children inherit, undone for a while:
    the --workers cells spread the workers over every core."""
    everywhere = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if shutil.which("taskset"):
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    try:
        yield
    finally:
        if everywhere:
            os.sched_setaffinity(0, everywhere)


def workers_latency_cell(tmp: Path, args: argparse.Namespace) -> dict[str, float]:
    """The p50 `proxy --workers N` adds at concurrency 1, non-streamed, over an upstream that
    answers at once and over one that takes 5 ms, as an engine's prefill at least does. The
    workers share their conversation links in memory: an answer waits for no store write
    (before the link table, the instant upstream's showed the wait, 0.2-0.4 ms)."""
    added: dict[str, list[float]] = {}
    for delay in ENGINE_DELAYS_MS:
        stub_port = free_port()
        stub = f"http://127.0.0.1:{stub_port}"
        with unpinned(), process(stub_argv(stub_port, raw=True, delay_ms=delay), stub_port):
            for _rep in range(2):
                alone = asyncio.run(load("direct", stub, False, 1, 1000, "k")).pct(0.5)
                for n in args.workers:
                    port = free_port()
                    cfg = tmp / f"workers-latency-{n}.yaml"
                    kvmigrate_config(cfg, port, stub, 0.0, False)
                    with process(proxy_argv(cfg, n), port):
                        time.sleep(1.0)
                        base = f"http://127.0.0.1:{port}"
                        proxied = asyncio.run(load("workers", base, False, 1, 1000, "k")).pct(0.5)
                    name = f"workers{n}.plain.c1.engine{delay:g}ms.added_p50_ms"
                    added.setdefault(name, []).append(proxied - alone)
                    print(
                        f"  workers={n}: adds {proxied - alone:.3f} ms p50 at c=1 "
                        f"behind a {delay:g} ms upstream",
                        flush=True,
                    )
    return {name: statistics.median(values) for name, values in added.items()}


def _ceiling(figures: dict[str, float], n: int, one: float) -> dict[str, float]:
    """What N workers could serve over one, given what each request costs on this machine's
    cores, and the share of it they served. Only with wrk: otherwise the load generator is
    this process, whose CPU is not counted, and the ceiling would read too high."""
    if shutil.which("wrk") is None:
        return {}
    per_request_us = sum(
        figures[f"workers{n}.plain.c64.{part}_cpu_us"] for part in ("proxy", "stub", "load")
    )
    cores = os.cpu_count()  # the cell runs unpinned
    if not per_request_us or not cores:
        return {}
    ceiling = min(float(n), cores * 1e6 / per_request_us / one)
    return {
        f"workers{n}.ceiling_vs_workers1": ceiling,
        f"workers{n}.of_ceiling": figures[f"workers{n}.vs_workers1"] / ceiling,
    }


def children_cpu_seconds() -> float:
    """User and system CPU time of this process's children that have ended: around one
    `wrk` run, that run's."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


WRK_SCRIPT = """wrk.method = "POST"
wrk.body = {body!r}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-client"
"""


def request_rate(base: str, seconds: float) -> float:
    """Non-streamed req/s at 64 connections: wrk (one thread, light) when installed, else
    this script's own load generator."""
    wrk = shutil.which("wrk")
    if wrk is None:
        result = asyncio.run(load("workers", base, False, 64, 6400, "sk-client"))
        return result.rps
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(WRK_SCRIPT.format(body=json.dumps(BODY)))
        script.flush()
        url = base + "/v1/chat/completions"
        argv = [wrk, "-t1", "-c64", f"-d{seconds:g}s", "-s", script.name, url]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if match is None:
        raise RuntimeError(f"no rate in wrk's output:\n{out}")
    return float(match.group(1))


if __name__ == "__main__":
    main()
