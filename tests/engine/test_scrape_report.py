"""The GPU scrape's figures in `kvmigrate report`, end to end: a proxy with `gpu.scrape` on
shadows traffic to the vLLM emulator while a DCGM exporter (a loopback server speaking its
exposition format) reports two GPUs; the report's prefix-cache figures agree with the
emulator's own /metrics, its utilisation with the exporter's, and cost per token prices the
candidate's GPU-hours against the hosted price of the tokens it answered."""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import openai
import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import load_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.engine import samples
from kvmigrate.engine.vllm_sample import EngineSample, read_vllm
from kvmigrate.recorder.store import open_store
from kvmigrate.runtime import build_app as build_proxy
from kvmigrate.serving import BackgroundServer

DCGM = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",device="nvidia0",Hostname="node-1"} 70
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1",device="nvidia1",Hostname="node-1"} 80
"""
CONFIG = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
models:
  - {{model_name: m, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{state: "sqlite:///{tmp}/state.db", noise_sample: 0}}
record: {{db: "sqlite:///{tmp}/records.db", workers: 1}}
gpu: {{scrape: true, interval_seconds: 1, dcgm_urls: ["{dcgm}/metrics"]}}
"""


def _dcgm() -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=DCGM)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


class Bed(NamedTuple):
    config: Path
    proxy: str
    vllm: str
    db: str


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings(profile="vllm", time_scale=0)))
    with hosted, vllm, BackgroundServer(_dcgm) as dcgm:
        path = tmp_path / "config.yaml"
        path.write_text(
            CONFIG.format(hosted=hosted.url, vllm=vllm.url, dcgm=dcgm.url, tmp=tmp_path)
        )
        config = load_config(path, env={})
        with BackgroundServer(lambda: build_proxy(config)) as proxy:
            yield Bed(path, proxy.url, vllm.url, config.record.db)


def _engine(bed: Bed) -> EngineSample:
    with urllib.request.urlopen(f"{bed.vllm}/metrics") as answer:
        return read_vllm(answer.read().decode())


def _scraped_after(bed: Bed, after: float) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open_store(bed.db) as store:
            stored = samples.read(store, after, time.time() + 1)
        if {r.kind for r in stored if r.error is None} == {"vllm", "dcgm"}:
            return
        time.sleep(0.1)
    raise AssertionError("no readable scrape stored")


def _settled(bed: Bed, answered: int) -> EngineSample:
    """The emulator's figures once every shadow copy has reached it."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = _engine(bed)
        if now.ttft is not None and now.ttft.count >= answered and now.running == 0:
            return now
        time.sleep(0.1)
    raise AssertionError("the shadow copies did not all arrive")


def _recorded(bed: Bed, count: int) -> None:
    """Until the recorder has written `count` records (it writes off the response path)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open_store(bed.db) as store:
            if store.query("SELECT count(*) FROM records")[0][0] >= count:
                return
        time.sleep(0.1)
    raise AssertionError("the records were not written")


def test_the_report_shows_engine_and_gpu_figures_beside_the_proxys(bed: Bed) -> None:
    since = time.time()
    before = _engine(bed)
    _scraped_after(bed, time.time())
    prefix = f"Session {uuid.uuid4().hex}. " + "you are a careful coding agent " * 60
    with openai.OpenAI(base_url=f"{bed.proxy}/v1", api_key="sk-client", max_retries=0) as client:
        messages = [{"role": "system", "content": prefix}]
        for turn in range(4):
            messages.append({"role": "user", "content": f"step {turn}"})
            answer = client.chat.completions.create(
                model="m",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=16,
            )
            messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    after = _settled(bed, 4)
    _scraped_after(bed, time.time())
    _recorded(bed, 8)  # each turn served by the primary and copied to the candidate

    args = ["report", "--config", str(bed.config), "--since", f"{time.time() - since + 1:.0f}s"]
    result = CliRunner().invoke(main, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.output)
    (engine,) = data["gpu"]["engines"]
    assert before.prefix_queries is not None
    assert after.prefix_queries is not None
    assert before.prefix_hits is not None
    assert after.prefix_hits is not None
    queries = after.prefix_queries - before.prefix_queries
    hits = after.prefix_hits - before.prefix_hits
    assert hits > 0
    assert engine["prefix_queries"] == {"value": queries, "reason": ""}
    assert engine["prefix_hits"] == {"value": hits, "reason": ""}
    assert engine["prefix_hit_ratio"]["value"] == pytest.approx(hits / queries)
    assert engine["kv_usage_max"]["reason"] == ""  # the emulator exports it, idle or not
    assert engine["itl_p50_ms"]["reason"] == (
        "not exported by this vLLM version (no vllm:inter_token_latency_seconds or "
        "vllm:time_per_output_token_seconds)"
    )
    gpu = data["gpu"]
    assert gpu["utilisation_pct"] == {"value": 75.0, "reason": ""}
    assert (gpu["band"], gpu["gpus_seen"], gpu["source"]) == ("within", 2, "dcgm")

    cost = data["cost_per_token"]
    assert (cost["gpus"], cost["gpus_source"]) == (2, "the GPU source's count")
    assert cost["hours_source"] == "between the first and last scrape"
    primary, candidate = cost["arms"]
    assert (primary["backend"], primary["requests"]) == ("hosted", 4)
    assert (candidate["backend"], candidate["requests"]) == ("vllm", 4)  # its shadow copies
    gpu_usd = 2 * cost["hours"] * 3.50  # the default --gpu-hour-price
    assert candidate["self_hosted_usd"] == pytest.approx(gpu_usd)
    load = gpu_usd / candidate["hosted_usd"]
    assert cost["break_even_load"] == pytest.approx(load)
    assert cost["break_even_utilisation_pct"] == pytest.approx(75.0 * load)

    text = CliRunner().invoke(main, args).output
    assert "75.0% (within the band)" in text
    assert "Cost per token, by arm, over the window" in text
    html = CliRunner().invoke(main, [*args, "--format", "html"]).output
    assert 'data-chart="gpu-use"' in html
    for series in ("GPU utilisation", "vllm KV cache", "target 70%", "target 80%"):
        assert f'data-series="{series}"' in html
