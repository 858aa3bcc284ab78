"""Helpers for the Anthropic Messages tests: a proxy in front of the anthropic emulator
(primary) and the vllm emulator (candidate), driven by the official anthropic SDK."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic

from kvmigrate.config import Config, parse_config
from kvmigrate.exchange import Exchange
from kvmigrate.serving import BackgroundServer

CLAUDE = "claude-sonnet-4-5"
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CLIENT_KEY = "sk-ant-api03-CLIENT-SECRET-KEY"
# The emulator's fault header reaches the candidate only where its config names it.
FAULTS_ALLOWED = ", candidate_headers: [x-emulator-fault]"
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def messages_config(
    primary_url: str,
    candidate_url: str,
    rollout: str = "{mode: shadow, noise_sample: 0}",
    extra: str = "",
    primary_extra: str = "",
    candidate_extra: str = "",
) -> Config:
    text = f"""
backends:
  hosted: {{type: anthropic, api_base: "{primary_url}/v1", read_timeout: 5 {primary_extra}}}
  vllm: {{api_base: "{candidate_url}/v1", read_timeout: 5, connect_timeout: 1 {candidate_extra}}}
models:
  - {{model_name: {CLAUDE}, hosted: {CLAUDE}, vllm: {VLLM_MODEL}}}
rollout: {rollout}
{extra}
"""
    return parse_config(text, env={})


class Exchanges:
    """A proxy addon that keeps every finished exchange, to see where copies went."""

    def __init__(self) -> None:
        self.done: list[Exchange] = []

    def exchange_done(self, exchange: Exchange) -> None:
        self.done.append(exchange)

    def wait(self, count: int, timeout: float = 10.0) -> list[Exchange]:
        deadline = time.monotonic() + timeout
        while len(self.done) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.done)

    def by_role(self, role: str) -> list[Exchange]:
        return [e for e in self.done if e.role == role]


@dataclass
class MessagesProxy:
    server: BackgroundServer
    exchanges: Exchanges
    clients: list[anthropic.Anthropic] = field(default_factory=list)

    def client(self, api_key: str | None = CLIENT_KEY, **kwargs: Any) -> anthropic.Anthropic:
        client = anthropic.Anthropic(
            base_url=self.server.url, api_key=api_key, max_retries=0, timeout=10.0, **kwargs
        )
        self.clients.append(client)
        return client


MessagesProxyFactory = Callable[..., MessagesProxy]


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": CLAUDE, "max_tokens": 64, "messages": [{"role": "user", "content": text}]} | (
        extra
    )
