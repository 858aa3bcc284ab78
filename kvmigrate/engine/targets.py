"""What the GPU scrape reads, from the config alone: never a URL a request could name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlencode

from kvmigrate.config import Config

Kind = Literal["vllm", "dcgm", "prometheus"]


@dataclass(frozen=True, slots=True)
class Target:
    kind: Kind
    url: str
    backend: str = ""  # the candidate a vllm target is a replica of; "" for a GPU source


def metrics_url(api_base: str) -> str:
    """vLLM serves /metrics at its root, beside /v1: `http://h:8000/v1` -> `http://h:8000/metrics`."""
    base = api_base.rstrip("/")
    base = base.removesuffix("/v1")
    return f"{base}/metrics"


def vllm_targets(config: Config) -> tuple[Target, ...]:
    """Each replica of every candidate: its `gpu.metrics_urls`, else beside each api_base
    of a candidate of type openai (azure, anthropic and litellm backends are hosted APIs)."""
    targets: list[Target] = []
    for name in config.candidate_backends():
        backend = config.backends[name]
        urls = config.gpu.metrics_urls.get(name)
        if urls is None and backend.type == "openai":
            urls = tuple(metrics_url(base) for base in backend.api_bases)
        targets += [Target("vllm", url, name) for url in dict.fromkeys(urls or ())]
    return tuple(targets)


def gpu_targets(config: Config) -> tuple[Target, ...]:
    gpu = config.gpu
    if gpu.prometheus_url:
        query = urlencode({"query": gpu.prometheus_query})
        return (Target("prometheus", f"{gpu.prometheus_url}/api/v1/query?{query}"),)
    return tuple(Target("dcgm", url) for url in gpu.dcgm_urls)


def scrape_targets(config: Config) -> tuple[Target, ...]:
    """Every target of an enabled scrape; none when `gpu.scrape` is off."""
    if not config.gpu.scrape:
        return ()
    return vllm_targets(config) + gpu_targets(config)
