"""Anthropic's Messages API through the proxy, the real vLLM CPU build's /v1/messages as the
candidate and the anthropic emulator as the primary, driven by the official anthropic SDK."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import orjson
import pytest

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.exchange import Exchange
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer
from kvmigrate.testbed.vllm_server import VllmServer
from kvmigrate.wire.anthropic_stream import assemble_messages

pytestmark = pytest.mark.vllm

CLAUDE = "claude-sonnet-4-5"
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
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


class Copies:
    def __init__(self) -> None:
        self.done: list[Exchange] = []

    def exchange_done(self, exchange: Exchange) -> None:
        self.done.append(exchange)

    def shadows(self, count: int) -> list[Exchange]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = [e for e in self.done if e.role == "shadow"]
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{count} shadow copies expected, got {len(found)}")


def _proxy(real_vllm: VllmServer, rollout: str, copies: Copies) -> Iterator[anthropic.Anthropic]:
    primary = EmulatorSettings(profile="anthropic", time_scale=0, cache_min_tokens=256)
    with BackgroundServer(lambda: build_app(primary)) as hosted:
        config = parse_config(
            f"""
backends:
  hosted: {{type: anthropic, api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{real_vllm.base_url}", read_timeout: 120}}
models:
  - {{model_name: {CLAUDE}, hosted: {CLAUDE}, vllm: tiny}}
rollout: {rollout}
""",
            env={},
        )
        with (
            BackgroundServer(lambda: build_proxy_app(config, addons=[copies])) as proxy,
            anthropic.Anthropic(
                base_url=proxy.url, api_key="sk-ant-client", max_retries=0, timeout=120
            ) as client,
        ):
            yield client


def _system() -> list[dict[str, Any]]:
    text = f"Session {uuid.uuid4().hex}. " + " ".join(WORDS[i % len(WORDS)] for i in range(400))
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


def test_shadow_copies_to_vllms_messages_api_stream_and_not_and_hit_its_cache(
    real_vllm: VllmServer,
) -> None:
    copies = Copies()
    for client in _proxy(real_vllm, "{mode: shadow, noise_sample: 0}", copies):
        system = _system()
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the test."}]
        first = client.messages.create(model=CLAUDE, max_tokens=8, system=system, messages=messages)
        assert first.id.startswith("msg_01")
        messages += [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": "And now?"},
        ]
        with client.messages.stream(
            model=CLAUDE, max_tokens=8, system=system, messages=messages
        ) as stream:
            second = stream.get_final_message()
        assert second.usage.cache_read_input_tokens  # the primary's breakpoint cache
    whole, streamed = sorted(copies.shadows(2), key=lambda e: e.stream)
    assert (whole.status, streamed.status) == (200, 200)
    assert orjson.loads(whole.body())["type"] == "message"
    assembled = assemble_messages(streamed.body())
    assert assembled is not None
    assert assembled["stop_reason"] in ("end_turn", "max_tokens")
    # Turn 2 resends turn 1's prompt: vLLM serves it from its prefix cache.
    assert streamed.token_counts()["cached"] > 0


def test_split_serves_a_tool_result_round_trip_from_vllm(real_vllm: VllmServer) -> None:
    copies = Copies()
    for client in _proxy(real_vllm, "{mode: split, percent: 100, fallback: false}", copies):
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "What is the weather in Lima?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": "18C"}],
            },
        ]
        raw = client.messages.with_raw_response.create(
            model=CLAUDE, max_tokens=8, tools=[WEATHER], messages=messages
        )
        assert raw.headers["x-kvmigrate-backend"] == "vllm"
        message = raw.parse()
        assert message.model == "tiny"
        assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")
        with client.messages.stream(
            model=CLAUDE, max_tokens=8, tools=[WEATHER], messages=messages
        ) as stream:
            kinds = {event.type for event in stream}
        assert {"message_start", "message_delta", "message_stop"} <= kinds
