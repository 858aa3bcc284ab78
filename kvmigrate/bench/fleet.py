"""Replica routing measured: multi-turn conversations through the proxy to emulated vLLM
replicas, each with its own prefix cache, under one routing strategy.

The figures come from the replicas themselves (`/metrics`: prefix-cache queries and hits in
tokens, finished requests), so they measure what the engines saw, not what the router meant
to do. A `single` run sends everything to one replica holding the fleet's whole cache
budget: the hit rate perfect affinity would give, which the fleet's rate is compared with.

Everything runs in this process: the replicas and the proxy on background threads, the
conversations on the calling thread's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kvmigrate.bench.conversations import synthetic
from kvmigrate.bench.runner import RunSettings, Target, run_bench
from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.proxy.app import SERVICE_KEY
from kvmigrate.proxy.replicas import ReplicaSet
from kvmigrate.serving import BackgroundServer

STRATEGIES = ("single", "bounded_hash", "round_robin")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """`cache_tokens` is one replica's prefix cache (0: practically unlimited); the single
    replica gets `replicas` times as much, the same total budget as the fleet."""

    replicas: int = 4
    conversations: int = 64
    turns: int = 8
    system_tokens: int = 256
    turn_tokens: int = 128
    max_tokens: int = 24
    concurrency: int = 16
    cache_tokens: int = 0
    time_scale: float = 0.2
    seed: int = 1
    session_ttl_s: float | None = None  # None: the proxy's default


@dataclass(frozen=True, slots=True)
class FleetResult:
    strategy: str
    hits: tuple[float, ...]  # prefix-cache hit tokens, per replica
    queries: tuple[float, ...]  # prompt tokens looked up, per replica
    requests: tuple[float, ...]  # finished requests, per replica
    in_flight: tuple[float, ...]  # time-averaged in-flight requests, per replica
    errors: int

    @property
    def hit_rate(self) -> float:
        return sum(self.hits) / max(sum(self.queries), 1.0)

    @property
    def request_max_mean(self) -> float:
        return _max_mean(self.requests)

    @property
    def in_flight_max_mean(self) -> float:
        return _max_mean(self.in_flight)


def _max_mean(values: Sequence[float]) -> float:
    mean = statistics.fmean(values) if values else 0.0
    return max(values) / mean if mean > 0 else float("nan")


def counter(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples (all label sets) in an exposition text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        return str(response.read().decode())


def _config_text(hosted: str, replicas: Sequence[str]) -> str:
    bases = ", ".join(f'"{url}/v1"' for url in replicas)
    return f"""
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: [{bases}], read_timeout: 60}}
models:
  - {{model_name: bench-model, hosted: gpt-4o-mini, vllm: {MODEL}}}
rollout: {{mode: split, percent: 100}}
"""


@contextlib.contextmanager
def _fleet(settings: FleetSettings, strategy: str) -> Iterator[tuple[str, list[str], ReplicaSet]]:
    count = 1 if strategy == "single" else settings.replicas
    capacity = settings.cache_tokens or 2_000_000_000
    if strategy == "single":
        capacity *= settings.replicas
    replica_settings = [
        EmulatorSettings(
            profile="vllm",
            name=f"replica-{i}",
            time_scale=settings.time_scale,
            cache_capacity_tokens=capacity,
            fault_seed=settings.seed + i,
        )
        for i in range(count)
    ]
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(BackgroundServer(lambda s=s: build_app(s)))
            for s in replica_settings
        ]
        hosted = stack.enter_context(
            BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
        )
        urls = [s.url for s in servers]
        config = parse_config(_config_text(hosted.url, urls), env={})
        proxy = stack.enter_context(BackgroundServer(lambda: build_proxy_app(config)))
        replicas = proxy.app[SERVICE_KEY].upstreams["vllm"].replicas
        if strategy == "round_robin":
            replicas.strategy = "round_robin"
        if settings.session_ttl_s is not None:
            replicas.session_ttl_s = settings.session_ttl_s
        yield proxy.url, urls, replicas


async def _drive(
    proxy_url: str, settings: FleetSettings, replicas: ReplicaSet
) -> tuple[int, list[float]]:
    conversations = synthetic(
        settings.conversations, settings.turns, settings.system_tokens, settings.turn_tokens,
        settings.seed,
    )  # fmt: skip
    target = Target(proxy_url + "/v1", "bench-model", "unused")
    run_settings = RunSettings(concurrency=settings.concurrency, max_tokens=settings.max_tokens)
    sums = [0.0] * len(replicas.loads)
    samples = 0
    done = asyncio.Event()

    async def sample() -> None:
        # The proxy's own in-flight counts (another thread writes them; reads are atomic).
        nonlocal samples
        while not done.is_set():
            for i, load in enumerate(replicas.loads):
                sums[i] += load
            samples += 1
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    try:
        run = await run_bench(target, conversations, run_settings)
    finally:
        done.set()
        await sampler
    errors = sum(1 for r in run.records if r.error is not None)
    return errors, [s / max(samples, 1) for s in sums]


def run_fleet(strategy: str, settings: FleetSettings) -> FleetResult:
    """Run the conversations through a fresh proxy and fleet under `strategy`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")
    with _fleet(settings, strategy) as (proxy_url, urls, replicas):
        errors, in_flight = asyncio.run(_drive(proxy_url, settings, replicas))
        texts = [_metrics(url) for url in urls]
    return FleetResult(
        strategy=strategy,
        hits=tuple(counter(t, "vllm:prefix_cache_hits_total") for t in texts),
        queries=tuple(counter(t, "vllm:prefix_cache_queries_total") for t in texts),
        requests=tuple(counter(t, "vllm:request_success_total") for t in texts),
        in_flight=tuple(in_flight),
        errors=errors,
    )
