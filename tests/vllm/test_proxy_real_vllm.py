"""The proxy in front of the real vLLM engine: prefix caching survives the trip."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import openai
import pytest

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer
from kvmigrate.testbed.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

TEXT = "the agent opens the repository reads the failing test and proposes a patch"
WORDS = TEXT.split(" ")


@pytest.fixture(scope="module")
def proxy_client(real_vllm: VllmServer) -> Iterator[openai.OpenAI]:
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
    with hosted:
        config = parse_config(
            f"""
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{real_vllm.base_url}"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: tiny}}
rollout: {{mode: split, percent: 100, fallback: false}}
""",
            env={},
        )
        with (
            BackgroundServer(lambda: build_proxy_app(config)) as proxy,
            openai.OpenAI(
                base_url=proxy.url + "/v1", api_key="sk-client-key", max_retries=0
            ) as client,
        ):
            yield client


def test_multi_turn_through_proxy_hits_the_prefix_cache(proxy_client: openai.OpenAI) -> None:
    messages: list[dict[str, str]] = [
        {"role": "system", "content": f"Session {uuid.uuid4().hex}. You are a coding agent."},
        {"role": "user", "content": " ".join(WORDS[i % len(WORDS)] for i in range(300))},
    ]
    cached = []
    for turn in range(3):
        raw = proxy_client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=messages, max_tokens=8
        )
        assert raw.headers["x-kvmigrate-backend"] == "vllm"
        completion = raw.parse()
        assert completion.usage is not None
        assert completion.usage.prompt_tokens_details
        cached.append(completion.usage.prompt_tokens_details.cached_tokens or 0)
        messages += [
            {"role": "assistant", "content": completion.choices[0].message.content or ""},
            {"role": "user", "content": f"Next step {turn}."},
        ]
    assert cached[0] == 0
    assert cached[1] > 0
    assert cached[2] > cached[1]


def test_streamed_reply_arrives_chunk_by_chunk(proxy_client: openai.OpenAI) -> None:
    start = time.perf_counter()
    arrivals = []
    stream = proxy_client.chat.completions.create(
        model="gpt-4o-mini",
        stream=True,
        # Enough tokens to take a while even on a fast core: the tiny model decodes 48 in
        # under 5 ms when the machine is idle, too fast to tell relaying from buffering.
        max_tokens=200,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": f"{uuid.uuid4().hex} tell me about caching"}],
    )
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            arrivals.append(time.perf_counter() - start)
        if chunk.usage is not None:
            usage = chunk.usage
    assert len(arrivals) >= 5
    # Relayed as produced: a buffering proxy would deliver every chunk at once at the end.
    # (vLLM itself sometimes emits a few tokens in a burst, so no per-chunk pacing is assumed.)
    assert arrivals[-1] - arrivals[0] > 0.010
    assert usage is not None
    assert usage.completion_tokens >= len(arrivals) - 1
