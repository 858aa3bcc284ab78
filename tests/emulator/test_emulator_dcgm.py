"""The emulated DCGM exporter beside the emulated vLLM: DCGM_FI_DEV_GPU_UTIL, in whole
percent, is the share of the time since the previous scrape that a request was running."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.engine.gpu_util import read_dcgm
from kvmigrate.serving import BackgroundServer


def _scrape(url: str) -> tuple[str, float]:
    with urllib.request.urlopen(url + "/dcgm/metrics", timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["content-type"].startswith("text/plain")
        text = answer.read().decode()
    return text, read_dcgm(text).util_pct


def test_utilisation_is_the_busy_share_between_scrapes() -> None:
    with BackgroundServer(lambda: build_app(EmulatorSettings("vllm", time_scale=1.0))) as vllm:
        text, _ = _scrape(vllm.url)
        assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-' in text
        assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
        time.sleep(0.3)
        assert _scrape(vllm.url)[1] == 0  # nothing ran since the last scrape

        with openai.OpenAI(base_url=vllm.url + "/v1", api_key="x", max_retries=0) as client:

            def ask() -> None:
                client.chat.completions.create(
                    model="meta-llama/Llama-3.1-8B-Instruct",
                    messages=[{"role": "user", "content": "Count slowly to forty, please."}],
                    max_tokens=40,
                )

            _scrape(vllm.url)
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda _: ask(), range(2)))
            # Most of the time since the last scrape (a loaded client leaves gaps).
            busy = _scrape(vllm.url)[1]
            assert 25 <= busy <= 100, busy
            assert float(busy).is_integer()
            time.sleep(0.3)
            assert _scrape(vllm.url)[1] == 0


def test_only_the_vllm_profile_has_one() -> None:
    with BackgroundServer(lambda: build_app(EmulatorSettings("hosted", time_scale=0.0))) as hosted:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(hosted.url + "/dcgm/metrics", timeout=10)
        assert refused.value.code == 404
        refused.value.close()
