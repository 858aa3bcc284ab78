"""What the proxy adds: latency, time to first chunk, throughput, shadow cost, memory.

One run measures, against the same upstream stub:
  direct        the stub itself (the baseline every figure is relative to)
  kvmigrate     the proxy in shadow mode with shadow_sample 0 (nothing mirrored)
  ...:messages  direct and kvmigrate on Anthropic's /v1/messages, the same prompt and answer
                in that API's wire format: `messages_minus_chat` is its added p50 less chat's
  kv+shadow     the proxy mirroring every request to the candidate (same stub)
  kv+full       kv+shadow plus the recorder and the cache-buster detector, as deployed
  litellm       LiteLLM's proxy (optional, --litellm), the baseline users compare us with

The proxy under test is pinned to core 0; the stub and this load generator to core 1.
Figures are ratios and differences against `direct` measured in the same run, never
absolute targets, so they mean the same on any machine.

    python benchmarks/proxy_overhead.py                 # kvmigrate only
    python benchmarks/proxy_overhead.py --litellm       # also LiteLLM (installed into a cache venv)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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


@dataclass
class Result:
    target: str
    mode: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    wall: float = 0.0
    # What the proxy reports it added itself (x-kvmigrate-overhead-ms): the client's clock
    # also counts the load generator's scheduling, which swamps 0.1 ms on a busy machine.
    reported: list[float] = field(default_factory=list)

    def pct(self, q: float) -> float:
        data = sorted(self.latencies)
        return data[min(len(data) - 1, int(q * len(data)))] * 1000 if data else float("nan")

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


def kvmigrate_config(path: Path, port: int, stub: str, shadow_sample: float, full: bool) -> None:
    """`full`: the recorder and the cache-buster detector on, as deployed by default; else
    forwarding alone, which is what the latency targets are about."""
    flag = "true" if full else "false"
    tmp = path.parent
    path.write_text(f"""
server: {{host: 127.0.0.1, port: {port}}}
backends:
  hosted: {{api_base: "{stub}/v1"}}
  vllm: {{api_base: "{stub}/v1"}}
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


async def one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    stream: bool,
    headers: dict[str, str],
    reported: list[float] | None = None,
) -> float:
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
        first = await response.content.readany()
        elapsed = time.perf_counter() - start
        if not first:
            raise RuntimeError("empty stream")
        async for _ in response.content.iter_any():
            pass
        return elapsed


async def load(
    target: str,
    base: str,
    stream: bool,
    concurrency: int,
    total: int,
    key: str,
    route: str = "chat",
) -> Result:
    path, template = ROUTES[route]
    body = json.dumps({**template, "stream": stream}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    result = Result(
        target if route == "chat" else f"{target}:{route}",
        "stream" if stream else "plain",
        concurrency,
    )
    url = base + path
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(min(50, total)):  # warm the pools
            await one(session, url, body, stream, headers)

        async def worker(n: int) -> None:
            for _ in range(n):
                try:
                    elapsed = await one(session, url, body, stream, headers, result.reported)
                    result.latencies.append(elapsed)
                except (TimeoutError, aiohttp.ClientError, RuntimeError):
                    result.errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker(total // concurrency) for _ in range(concurrency)))
        result.wall = time.perf_counter() - start
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


def run_target(
    name: str, base: str, key: str, args: argparse.Namespace, route: str = "chat"
) -> list[Result]:
    results = []
    for stream in (False, True):
        for concurrency in args.concurrency:
            total = max(args.requests, concurrency * 10)
            if name == "litellm":
                total = min(total, args.litellm_requests)
            result = asyncio.run(load(name, base, stream, concurrency, total, key, route))
            results.append(result)
            print(
                f"  {result.target:18} {result.mode:6} c={concurrency:<3}"
                f" p50 {result.pct(0.5):7.2f} ms"
                f"  p99 {result.pct(0.99):7.2f} ms  {result.rps:8.0f} req/s"
                f"  errors {result.errors}",
                flush=True,
            )
    return results


def summary(results: list[Result], memory: tuple[int, int] | None) -> dict[str, float]:
    def get(target: str, mode: str, c: int) -> Result | None:
        return next(
            (r for r in results if (r.target, r.mode, r.concurrency) == (target, mode, c)), None
        )

    figures: dict[str, float] = {}
    for target in ("kvmigrate", "kv+shadow", "kv+full", "litellm"):
        for mode in ("plain", "stream"):
            for c in (1, 16, 64):
                base, res = get("direct", mode, c), get(target, mode, c)
                if base and res and res.latencies:
                    figures[f"{target}.{mode}.c{c}.added_p50_ms"] = res.pct(0.5) - base.pct(0.5)
                    figures[f"{target}.{mode}.c{c}.added_p99_ms"] = res.pct(0.99) - base.pct(0.99)
                    figures[f"{target}.{mode}.c{c}.rps"] = res.rps
    for target in ("kvmigrate", "kv+full"):
        for mode in ("plain", "stream"):
            for c in (16, 64):
                kv, lite = get(target, mode, c), get("litellm", mode, c)
                if kv and lite and lite.rps:
                    figures[f"throughput_ratio.{target}.{mode}.c{c}"] = kv.rps / lite.rps
    for mode in ("plain", "stream"):
        for c in (1, 16, 64):
            chat = figures.get(f"kvmigrate.{mode}.c{c}.added_p50_ms")
            base, res = get("direct:messages", mode, c), get("kvmigrate:messages", mode, c)
            if chat is not None and base and res and res.latencies:
                added = res.pct(0.5) - base.pct(0.5)
                figures[f"kvmigrate:messages.{mode}.c{c}.added_p50_ms"] = added
                # The target: within 0.1 ms of chat's added p50.
                figures[f"messages_minus_chat.{mode}.c{c}.added_p50_ms"] = added - chat
            chat_res = get("kvmigrate", mode, c)
            if chat_res and chat_res.reported and res and res.reported:
                own = statistics.median(res.reported) - statistics.median(chat_res.reported)
                figures[f"messages_minus_chat.{mode}.c{c}.reported_p50_ms"] = own
    kv1, sh1 = get("kvmigrate", "plain", 1), get("kv+shadow", "plain", 1)
    if kv1 and sh1:
        figures["shadow_extra_p50_ms"] = sh1.pct(0.5) - kv1.pct(0.5)
    if memory:
        figures["open_streams"], figures["rss_mib_with_open_streams"] = memory[0], memory[1] / 1024
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="requests per cell")
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64]
    )
    parser.add_argument("--litellm", action="store_true", help="also measure LiteLLM's proxy")
    parser.add_argument(
        "--no-messages",
        dest="messages",
        action="store_false",
        help="skip the Anthropic /v1/messages cells (direct and kvmigrate, beside chat's)",
    )
    parser.add_argument("--litellm-requests", type=int, default=600)
    parser.add_argument("--streams", type=int, default=1000, help="open streams for the RSS test")
    parser.add_argument("--json", type=Path, help="write all figures here")
    args = parser.parse_args()
    if shutil.which("taskset"):
        os.sched_setaffinity(0, {1})
    stub_port, kv_port, shadow_port, full_port, lite_port = (free_port() for _ in range(5))
    stub = f"http://127.0.0.1:{stub_port}"
    results: list[Result] = []
    memory = None
    with (
        tempfile.TemporaryDirectory() as tmp,
        process(
            pinned(1, [sys.executable, str(HERE / "upstream_stub.py"), "--port", str(stub_port)]),
            stub_port,
        ),
    ):
        print("direct (stub)", flush=True)
        results += run_target("direct", stub, "sk-stub", args)
        if args.messages:
            results += run_target("direct", stub, "sk-stub", args, route="messages")
        for name, port, sample, full in (
            ("kvmigrate", kv_port, 0.0, False),
            ("kv+shadow", shadow_port, 1.0, False),
            ("kv+full", full_port, 1.0, True),
        ):
            cfg = Path(tmp) / f"{name.replace('+', '-')}.yaml"
            kvmigrate_config(cfg, port, stub, sample, full)
            argv = pinned(0, [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(cfg)])
            with process(argv, port) as proc:
                print(name, flush=True)
                results += run_target(name, f"http://127.0.0.1:{port}", "sk-client", args)
                if name == "kvmigrate" and args.messages:
                    url = f"http://127.0.0.1:{port}"
                    results += run_target(name, url, "sk-client", args, route="messages")
                if name == "kvmigrate" and args.streams:
                    memory = asyncio.run(
                        open_streams(
                            f"http://127.0.0.1:{port}", args.streams, "sk-client", proc.pid
                        )
                    )
                    print(f"  {memory[0]} open streams: proxy RSS {memory[1] / 1024:.1f} MiB")
        if args.litellm:
            litellm = ensure_litellm()
            cfg = Path(tmp) / "litellm.yaml"
            litellm_config(cfg, stub)
            argv = pinned(
                0,
                [
                    str(litellm),
                    "--config",
                    str(cfg),
                    "--port",
                    str(lite_port),
                    "--num_workers",
                    "1",
                ],
            )
            env = {
                "LITELLM_MASTER_KEY": "sk-bench",
                "LITELLM_LOG": "ERROR",
                "LITELLM_TELEMETRY": "False",
                "DISABLE_SCHEMA_UPDATE": "true",
            }
            with process(argv, lite_port, env=env, timeout=180):
                print("litellm", flush=True)
                results += run_target("litellm", f"http://127.0.0.1:{lite_port}", "sk-bench", args)
    figures = summary(results, memory)
    print("\nsummary (differences and ratios against the direct baseline of this run):")
    for name, value in figures.items():
        print(f"  {name:45} {value:10.3f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
