"""The `gpu:` section: what the scrape reads comes from the config alone, and every value
that cannot be scraped is refused at its key."""

from __future__ import annotations

import pytest

from kvmigrate.config import ConfigError, parse_config
from kvmigrate.engine.targets import Target, metrics_url, scrape_targets

BASE = """
backends:
  hosted: {api_base: "https://api.openai.com/v1"}
  vllm: {api_base: ["http://gpu-1:8000/v1", "http://gpu-2:8000/v1/"]}
  vllm-fp8: {api_base: "http://gpu-3:8000"}
  azure: {type: azure, api_base: "https://x.openai.azure.com", api_version: "2024-10-21"}
models:
  - {model_name: m, hosted: m, vllm: m, vllm-fp8: m, azure: m, candidates: [vllm, vllm-fp8, azure]}
"""


def test_off_by_default_and_nothing_scraped() -> None:
    config = parse_config(BASE, env={})
    assert config.gpu.scrape is False
    assert scrape_targets(config) == ()


def test_every_replica_of_each_openai_candidate_beside_its_api_base() -> None:
    config = parse_config(BASE + "gpu: {scrape: true, prometheus_url: 'http://prom:9090'}", env={})
    assert scrape_targets(config) == (
        Target("vllm", "http://gpu-1:8000/metrics", "vllm"),
        Target("vllm", "http://gpu-2:8000/metrics", "vllm"),
        Target("vllm", "http://gpu-3:8000/metrics", "vllm-fp8"),
        Target(
            "prometheus",
            "http://prom:9090/api/v1/query?query=avg%28DCGM_FI_DEV_GPU_UTIL%29",
        ),
    )  # the azure candidate is a hosted API: not scraped


def test_metrics_urls_replace_a_candidates_default() -> None:
    text = BASE + (
        "gpu:\n  scrape: true\n  metrics_urls: {vllm: ['http://lb-0:9000/metrics']}\n"
        "  dcgm_urls: ['http://dcgm-a:9400/metrics', 'http://dcgm-b:9400/metrics']\n"
    )
    targets = scrape_targets(parse_config(text, env={}))
    assert [(t.kind, t.url, t.backend) for t in targets] == [
        ("vllm", "http://lb-0:9000/metrics", "vllm"),
        ("vllm", "http://gpu-3:8000/metrics", "vllm-fp8"),
        ("dcgm", "http://dcgm-a:9400/metrics", ""),
        ("dcgm", "http://dcgm-b:9400/metrics", ""),
    ]


@pytest.mark.parametrize(
    ("api_base", "url"),
    [
        ("http://h:8000/v1", "http://h:8000/metrics"),
        ("http://h:8000/v1/", "http://h:8000/metrics"),
        ("http://h:8000", "http://h:8000/metrics"),
        ("https://h/vllm/v1", "https://h/vllm/metrics"),
    ],
)
def test_metrics_url(api_base: str, url: str) -> None:
    assert metrics_url(api_base) == url


@pytest.mark.parametrize(
    ("gpu", "error"),
    [
        ("{scrape: true, metrics_urls: {hosted: ['http://x/metrics']}}",
         "gpu.metrics_urls.hosted: not a candidate backend; the candidates are: vllm, vllm-fp8, "
         "azure"),
        ("{scrape: true, metrics_urls: {vllm: 'http://x/metrics'}}",
         "gpu.metrics_urls.vllm: expected a non-empty list of http(s) URLs"),
        ("{scrape: true, dcgm_urls: ['file:///etc/passwd']}",
         "gpu.dcgm_urls[0]: expected a http/https URL, got 'file:///etc/passwd'"),
        ("{scrape: true, prometheus_url: 'http://p:9090', dcgm_urls: ['http://d/metrics']}",
         "gpu.prometheus_url: give dcgm_urls or prometheus_url, not both"),
        ("{dcgm_urls: ['http://d/metrics']}", "gpu.dcgm_urls: is scraped only with `scrape: true`"),
        ("{scrape: true, prometheus_query: '  '}",
         "gpu.prometheus_query: expected one line of PromQL, at most 2048 characters"),
        ("{scrape: true, prometheus_query: \"up\\nbad\"}",
         "gpu.prometheus_query: expected one line of PromQL, at most 2048 characters"),
        ("{interval_seconds: 0.5}", "gpu.interval_seconds: must be at least 1.0; got 0.5"),
        ("{timeout_seconds: 61}", "gpu.timeout_seconds: must be at most 60.0; got 61"),
        ("{max_body_bytes: 10}", "gpu.max_body_bytes: must be at least 1024; got 10"),
        ("{device: tpu}", "gpu.device: must be one of gpu, cpu; got 'tpu'"),
        ("{scrap: true}", "gpu.scrap: unknown key (did you mean 'scrape'?)"),
    ],
)  # fmt: skip
def test_refused_at_its_key(gpu: str, error: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(BASE + f"gpu: {gpu}\n", env={})
    assert str(refused.value) == f"<config>: {error}"


def test_a_scrape_needs_the_records_to_store_its_samples() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(BASE + "record: {enabled: false}\ngpu: {scrape: true}\n", env={})
    assert str(refused.value) == (
        "<config>: gpu.scrape: needs record.enabled: the samples are stored with the records"
    )
