"""The GPU scrape against the real vLLM engine (CPU build): the KV-cache and prefix-cache
figures in `kvmigrate report` agree with the engine's own /metrics, read directly."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import Config, load_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.engine import samples
from kvmigrate.engine.scraper import GpuScraper
from kvmigrate.engine.vllm_sample import EngineSample, read_vllm
from kvmigrate.recorder.store import open_store
from kvmigrate.render import fmt
from kvmigrate.runtime import build_app as build_proxy
from kvmigrate.serving import BackgroundServer
from kvmigrate.testbed.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

WORDS = [
    "the",
    "agent",
    "opens",
    "the",
    "repository",
    "reads",
    "the",
    "failing",
    "test",
    "and",
    "proposes",
    "a",
    "patch",
]
CONFIG = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: tiny}}
rollout: {{mode: split, percent: 100, fallback: false, state: "sqlite:///{tmp}/state.db"}}
record: {{db: "sqlite:///{tmp}/records.db", workers: 1}}
gpu: {{scrape: true, interval_seconds: 1, device: cpu}}
"""


def direct(server: VllmServer) -> EngineSample:
    """The engine's own /metrics, read by the test itself."""
    with urllib.request.urlopen(f"{server.root_url}/metrics", timeout=10) as answer:
        return read_vllm(answer.read().decode())


def idle(server: VllmServer) -> EngineSample:
    """The engine's figures once nothing runs or waits (a shadow of nothing: split 100%)."""
    for _ in range(100):
        now = direct(server)
        if now.running == 0 and now.waiting == 0:
            return now
        time.sleep(0.1)
    raise AssertionError("vLLM did not go idle")


def wait_for_scrape(db: str, after: float) -> None:
    """Until the proxy has stored a readable scrape that started after `after`."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open_store(db) as store:
            stored = samples.read(store, after, time.time() + 1)
        if any(r.engine is not None and r.ts > after for r in stored):
            return
        time.sleep(0.2)
    raise AssertionError("no scrape stored")


@pytest.fixture
def bed(real_vllm: VllmServer, tmp_path: Path) -> Iterator[tuple[Config, Path, str]]:
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
    with hosted:
        path = tmp_path / "config.yaml"
        path.write_text(CONFIG.format(hosted=hosted.url, vllm=real_vllm.base_url, tmp=tmp_path))
        config = load_config(path, env={})
        with BackgroundServer(lambda: build_proxy(config)) as proxy:
            yield config, path, proxy.url


def conversation(client: openai.OpenAI) -> None:
    """Three turns resending their history: the later ones hit the prefix cache."""
    messages = [
        {"role": "system", "content": f"Session {uuid.uuid4().hex}. You are a coding agent."},
        {"role": "user", "content": " ".join(WORDS[i % len(WORDS)] for i in range(300))},
    ]
    for turn in range(3):
        completion = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            max_tokens=8,  # type: ignore[arg-type]
        )
        messages += [
            {"role": "assistant", "content": completion.choices[0].message.content or ""},
            {"role": "user", "content": f"Next step {turn}."},
        ]


def long_answers(client: openai.OpenAI, count: int) -> list[threading.Thread]:
    """`count` 1,500-token answers decoding at once, asked for whole: streamed, the tiny model's
    tokens keep vLLM's API server so busy that each /metrics read waits about two seconds, as
    long as the answers take, and no scrape falls between two reads while they decode."""

    def one() -> None:
        client.chat.completions.create(
            model="gpt-4o-mini",
            max_tokens=1500,
            extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": f"{uuid.uuid4().hex} write at length"}],
        )

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


async def scrape_between_reads(config: Config, server: VllmServer) -> tuple[float, float, float]:
    """(direct before, scraped, direct after) KV-cache usage, the scrape stored as a proxy's."""
    scraper = GpuScraper(config, source="test")
    scraper.open()
    try:
        before = await asyncio.to_thread(direct, server)
        (result,) = await scraper.scrape_once()
        after = await asyncio.to_thread(direct, server)
    finally:
        await scraper.close()
    assert result.engine is not None, result.error
    values = (before.kv_usage, result.engine.kv_usage, after.kv_usage)
    assert None not in values
    return values  # type: ignore[return-value]


def kv_readings_while_decoding(
    client: openai.OpenAI, config: Config, server: VllmServer
) -> list[tuple[float, float, float]]:
    """Scrapes between direct reads while batches of four long answers decode, until one reading
    sees the cache grow between its two reads. A new batch starts only between readings, once
    the last has ended: a stall of the engine's /metrics on a loaded machine can outlast a batch."""
    readings: list[tuple[float, float, float]] = []
    threads: list[threading.Thread] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if not any(thread.is_alive() for thread in threads):
            threads = long_answers(client, 4)
        readings.append(asyncio.run(scrape_between_reads(config, server)))
        if 0 < readings[-1][0] < readings[-1][2]:
            break
    for thread in threads:
        thread.join(120)
    return readings


def test_report_shows_the_engines_kv_and_prefix_figures(
    bed: tuple[Config, Path, str], real_vllm: VllmServer
) -> None:
    config, path, proxy = bed
    db = config.record.db
    since = time.time()
    start = idle(real_vllm)
    wait_for_scrape(db, time.time())  # the window's first sample: the engine as it is now

    with openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-client", max_retries=0) as client:
        conversation(client)
        readings = kv_readings_while_decoding(client, config, real_vllm)
    end = idle(real_vllm)
    wait_for_scrape(db, time.time())

    # While one batch decodes its KV cache only grows, so a scrape between two reads that
    # both see it in use (the later no lower) sees a value between theirs.
    growing = [r for r in readings if 0 < r[0] <= r[2]]
    assert any(r[2] > r[0] for r in growing), readings
    for before, scraped, after in growing:
        assert before <= scraped <= after

    args = ["report", "--config", str(path), "--since", f"{time.time() - since + 1:.0f}s"]
    data = orjson.loads(CliRunner().invoke(main, [*args, "--format", "json"]).output)
    engine = data["gpu"]["engines"][0]
    assert engine["backend"] == "vllm"
    assert engine["answering"] == 1
    assert start.prefix_queries is not None
    assert end.prefix_queries is not None
    assert start.prefix_hits is not None
    assert end.prefix_hits is not None
    queries = end.prefix_queries - start.prefix_queries
    hits = end.prefix_hits - start.prefix_hits
    assert hits > 0
    assert engine["prefix_queries"]["value"] == queries
    assert engine["prefix_hits"]["value"] == hits
    assert engine["prefix_hit_ratio"]["value"] == pytest.approx(hits / queries)
    assert engine["kv_usage_max"]["value"] >= max(scraped for _, scraped, _ in growing) > 0
    assert engine["ttft_p50_ms"]["value"] is not None
    assert engine["itl_p50_ms"]["value"] is not None
    assert data["gpu"]["utilisation_pct"]["reason"] == (
        "a CPU build of vLLM (gpu.device: cpu) has no GPU to measure"
    )

    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert "GPU and KV use of the candidate, over the window" in text.output
    assert fmt.pct(hits / queries) in text.output
    assert fmt.number(queries) in text.output
    assert fmt.pct(engine["kv_usage_max"]["value"]) in text.output
    assert "a CPU build of vLLM (gpu.device: cpu) has no GPU to measure" in text.output
