"""Decode speed as Prometheus histograms: observed per stream that carries usage, from
what the proxy measured while relaying it, for the served answer and its shadow copy."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator

import pytest
from proxy_support import ProxyFactory
from settling import counted

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.emulator.settings import Profile, latency_for
from kvmigrate.serving import BackgroundServer

TOKENS = 21  # the shortest answer: 20 tokens after the first
DECODE_TPS: dict[Profile, float] = {"hosted": 200.0, "vllm": 50.0}
SERIES = re.compile(
    r'^(kvmigrate_[a-z_]+)\{backend="([^"]+)",cohort="[^"]*",role="([^"]+)"\} (\S+)$'
)


def _emulator(profile: Profile) -> EmulatorSettings:
    latency = latency_for(
        profile, ttft_base_s=0.005, ttft_jitter_s=0.0, decode_tokens_per_s=DECODE_TPS[profile]
    )
    return EmulatorSettings(
        profile, time_scale=1.0, latency=latency,
        min_output_tokens=TOKENS, max_output_tokens_default=TOKENS,
    )  # fmt: skip


@pytest.fixture(scope="module")
def paced() -> Iterator[tuple[str, str]]:
    with (
        BackgroundServer(lambda: build_app(_emulator("hosted"))) as hosted,
        BackgroundServer(lambda: build_app(_emulator("vllm"))) as vllm,
    ):
        yield hosted.url, vllm.url


def _series(url: str) -> dict[tuple[str, str, str], float]:
    """(metric, backend, role): value, for the decode histograms' counts and sums."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        body = response.read().decode()
    out = {}
    for line in body.splitlines():
        match = SERIES.match(line)
        if match and match.group(1).endswith(("_count", "_sum")):
            out[(match.group(1), match.group(2), match.group(3))] = float(match.group(4))
    return out


def test_each_stream_with_usage_is_one_observation(
    make_proxy: ProxyFactory, paced: tuple[str, str]
) -> None:
    proxy = make_proxy("{mode: shadow, noise_sample: 0}", hosted_url=paced[0], vllm_url=paced[1])
    client = proxy.client()
    messages = [{"role": "user", "content": "Summarise the incident."}]
    with_usage = client.chat.completions.create(
        model="gpt-4o-mini", messages=messages, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(with_usage)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens >= TOKENS
    # Without usage the client's answer has no token count: only its shadow copy (which
    # always asks for usage) counts.
    without = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=messages,
        stream=True,  # type: ignore[arg-type]
    )
    assert all(chunk.usage is None for chunk in without)
    tps, tpot = "kvmigrate_decode_tokens_per_second", "kvmigrate_time_per_output_token_seconds"
    counted(proxy.url, answers=2)  # the copies of both answers are sent by now
    deadline = time.monotonic() + 30
    while (series := _series(proxy.url)).get((tps + "_count", "vllm", "shadow"), 0) < 2:
        assert time.monotonic() < deadline, series
        time.sleep(0.05)
    gap = "kvmigrate_stream_max_chunk_gap_seconds"
    for metric in (tps, tpot, gap):
        assert series[(metric + "_count", "hosted", "serve")] == 1.0
        assert series[(metric + "_count", "vllm", "shadow")] == 2.0
    # The emulators pace their tokens: what the proxy saw is at most that fast (a loaded
    # machine only adds to each gap).
    hosted_tps = series[(tps + "_sum", "hosted", "serve")]
    vllm_tps = series[(tps + "_sum", "vllm", "shadow")] / 2
    assert 0 < vllm_tps <= 50 * 1.1
    assert 0 < hosted_tps <= 200 * 1.1
    hosted_tpot = series[(tpot + "_sum", "hosted", "serve")]
    assert hosted_tpot == pytest.approx(1 / hosted_tps, rel=0.01)
    assert series[(gap + "_sum", "vllm", "shadow")] / 2 >= 1 / 50 * 0.9
