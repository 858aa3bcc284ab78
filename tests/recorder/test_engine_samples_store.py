"""Scrape results stored beside the records, in SQLite and PostgreSQL alike: written, read
back as they were, and pruned with the records."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from kvmigrate.engine import samples
from kvmigrate.engine.gpu_util import GpuSample
from kvmigrate.engine.samples import ScrapeResult
from kvmigrate.engine.vllm_sample import EngineSample, Histogram
from kvmigrate.recorder import open_store

ITL = Histogram(((0.01, 3.0), (0.1, 7.0), (math.inf, 8.0)), 0.4, 8.0)
RESULTS = [
    ScrapeResult(
        100.0, "vllm", "vllm", "http://gpu-1:8000/metrics",
        engine=EngineSample(
            kv_usage=0.25, running=3.0, waiting=0.0, prefix_queries=616.0, prefix_hits=288.0,
            prompt_tokens=None, generation_tokens=16.0, ttft=None, itl=ITL,
            absent=("prompt_tokens", "ttft"), bad_lines=2,
        ),
    ),
    ScrapeResult(100.0, "dcgm", "", "http://dcgm:9400/metrics", gpu=GpuSample(72.5, 4)),
    ScrapeResult(200.0, "prometheus", "", "http://prom:9090/api/v1/query?query=up",
                 gpu=GpuSample(40.0, None)),
    ScrapeResult(300.0, "vllm", "vllm", "http://gpu-2:8000/metrics",
                 error="timeout: no whole answer within 5 s"),
]  # fmt: skip


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/records.db"
    return str(request.getfixturevalue("pg_url"))


def test_results_read_back_as_written_within_the_window(url: str) -> None:
    with open_store(url) as store:
        assert "m010_engine_samples" in store.applied_migrations()
        samples.write(store, RESULTS, "proxy-a")
        stored = [replace(r, source="proxy-a") for r in RESULTS]
        assert samples.read(store, 0, 1000) == stored
        assert samples.read(store, 150, 300) == stored[2:3]
        assert store.query("SELECT DISTINCT source FROM engine_samples") == [("proxy-a",)]


def test_samples_are_pruned_with_the_records(url: str) -> None:
    with open_store(url) as store:
        samples.write(store, RESULTS, "proxy-a")
        store.prune(250.0)
        assert samples.read(store, 0, 1000) == [replace(RESULTS[3], source="proxy-a")]
