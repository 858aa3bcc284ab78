"""The GPU scrape against exporters that answer garbage, too much, or nothing: the proxy
keeps serving, each failure is counted and stored with its reason, and `kvmigrate report`
says why each figure is missing."""

from __future__ import annotations

import asyncio
import time
import urllib.request
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
from kvmigrate.recorder.store import open_store
from kvmigrate.runtime import build_app as build_proxy
from kvmigrate.serving import BackgroundServer

HUGE = 1 << 20  # bytes the huge exporter sends, past the config's cap below


def _exporters() -> web.Application:
    async def garbage(_: web.Request) -> web.Response:
        # Not metrics at all, and four lines of vLLM metrics that cannot be read.
        broken = 'vllm:kv_cache_usage_perc{engine="0" 0.5\nvllm:num_requests_running x\n'
        return web.Response(text="<html>{{{ not metrics\x00\n" * 50 + broken + broken[:-1])

    async def huge(_: web.Request) -> web.StreamResponse:
        return web.Response(body=b"# padding\n" * (HUGE // 10))

    async def hang(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(60)
        return web.Response()

    app = web.Application()
    app.router.add_get("/garbage/metrics", garbage)
    app.router.add_get("/huge/metrics", huge)
    app.router.add_get("/hang/metrics", hang)
    return app


CONFIG = """
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
models:
  - {{model_name: m, hosted: gpt-4o-mini, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{state: "sqlite:///{tmp}/state.db"}}
record: {{db: "sqlite:///{tmp}/records.db", workers: 1}}
gpu:
  scrape: true
  interval_seconds: 1
  timeout_seconds: 4
  max_body_bytes: 65536
  metrics_urls:
    vllm: ["{bad}/garbage/metrics", "{bad}/huge/metrics", "{bad}/hang/metrics"]
  dcgm_urls: ["{vllm}/metrics"]
"""


class Bed(NamedTuple):
    config: Path
    proxy: str
    exporters: str  # the misbehaving exporters' base URL
    vllm: str  # the vllm emulator's, whose /metrics has no DCGM series


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings(profile="vllm", time_scale=0)))
    with hosted, vllm, BackgroundServer(_exporters) as bad:
        path = tmp_path / "config.yaml"
        path.write_text(CONFIG.format(hosted=hosted.url, vllm=vllm.url, bad=bad.url, tmp=tmp_path))
        config = load_config(path, env={})
        with BackgroundServer(lambda: build_proxy(config)) as proxy:
            yield Bed(path, proxy.url, bad.url, vllm.url)


def _scrapes(db: str) -> dict[str, str | None]:
    """Each target's last stored result: its error, or None."""
    with open_store(db) as store:
        return {r.target: r.error for r in samples.read(store, 0, time.time() + 1)}


def test_failing_exporters_leave_the_proxy_serving_and_the_report_says_why(
    bed: Bed, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path}/records.db"
    expected = {
        f"{bed.exporters}/garbage/metrics": (
            "unreadable: no vLLM metric in the answer (4 unreadable lines)"
        ),
        f"{bed.exporters}/huge/metrics": "too_large: the answer is larger than 65,536 bytes",
        f"{bed.exporters}/hang/metrics": "timeout: no whole answer within 4 s",
        f"{bed.vllm}/metrics": "unreadable: no DCGM_FI_DEV_GPU_UTIL series in the answer",
    }
    deadline = time.monotonic() + 30
    seen: dict[str, str | None] = {}
    with openai.OpenAI(base_url=f"{bed.proxy}/v1", api_key="sk-client", max_retries=0) as client:
        while len(seen) < len(expected) and time.monotonic() < deadline:
            # Answers keep coming while scrapes hang, overflow and fail to parse, and none
            # waits for the hanging scrape's 4 s timeout.
            started = time.perf_counter()
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
            assert raw.http_response.status_code == 200
            assert raw.headers["x-kvmigrate-backend"] == "hosted"
            assert raw.parse().choices[0].message.content
            assert time.perf_counter() - started < 3.0
            seen = _scrapes(db)
            time.sleep(0.2)
    assert seen == expected

    with urllib.request.urlopen(f"{bed.proxy}/metrics") as answer:
        exposed = answer.read().decode()
    for kind, result in (
        ("vllm", "unreadable"), ("vllm", "too_large"), ("vllm", "timeout"), ("dcgm", "unreadable")
    ):  # fmt: skip
        assert f'kvmigrate_gpu_scrapes_total{{kind="{kind}",result="{result}"}}' in exposed

    text = CliRunner().invoke(main, ["report", "--config", str(bed.config), "--since", "1h"])
    assert text.exit_code == 0, text.output
    assert "GPU and KV use of the candidate, over the window" in text.output
    assert "scrape failing since" in text.output
    for url, why in expected.items():
        assert why in text.output, url
    args = ["report", "--config", str(bed.config), "--since", "1h", "--format", "json"]
    data = orjson.loads(CliRunner().invoke(main, args).output)
    engine = data["gpu"]["engines"][0]
    assert (engine["backend"], engine["replicas"], engine["answering"]) == ("vllm", 3, 0)
    assert engine["kv_usage_mean"]["value"] is None
    assert engine["kv_usage_mean"]["reason"].startswith("scrape failing since")
    assert dict(engine["failing"]) == {u: w for u, w in expected.items() if bed.exporters in u}
    utilisation = data["gpu"]["utilisation_pct"]
    assert utilisation["value"] is None
    assert utilisation["reason"].endswith(f"{expected[bed.vllm + '/metrics']} ({bed.vllm}/metrics)")
    assert data["gpu"]["band"] == "not measured"
