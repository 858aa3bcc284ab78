"""Helpers for the proxy tests: config for a proxy in front of emulated backends, and handles."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from kvmigrate.config import Config, parse_config
from kvmigrate.serving import BackgroundServer

HOSTED_MODEL = "gpt-4o-mini"
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class Backends:
    hosted: BackgroundServer
    vllm: BackgroundServer


# The emulator's fault header reaches a candidate only where the config lets it: a test bed
# that injects candidate faults passes this as `vllm_extra`.
# A minimal whole chat completion, as the tests' own upstreams answer.
CHAT_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
FAULTS_ALLOWED = ", candidate_headers: [x-emulator-fault]"


def proxy_config(
    hosted_url: str,
    vllm_url: str,
    rollout: str = "{mode: shadow}",
    extra: str = "",
    hosted_extra: str = "",
    vllm_extra: str = "",
    hosted_read_timeout: float = 5,
) -> Config:
    text = f"""
backends:
  hosted: {{api_base: "{hosted_url}/v1", read_timeout: {hosted_read_timeout} {hosted_extra}}}
  vllm: {{api_base: "{vllm_url}/v1", read_timeout: 2, connect_timeout: 1 {vllm_extra}}}
models:
  - {{model_name: {HOSTED_MODEL}, hosted: {HOSTED_MODEL}, vllm: {VLLM_MODEL}}}
  - {{model_name: text-embedding-3-small, hosted: text-embedding-3-small}}
rollout: {rollout}
{extra}
"""
    return parse_config(text, env={})


@dataclass
class RunningProxy:
    server: BackgroundServer
    config: Config
    clients: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, api_key: str = "sk-client", **kwargs: Any) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kwargs)
        self.clients.append(client)
        return client

    def async_client(self, api_key: str = "sk-client") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include `labels`."""
        import urllib.request

        text = urllib.request.urlopen(self.url + "/metrics", timeout=5).read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total


ProxyFactory = Callable[..., RunningProxy]


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


CHAT_BODY = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}'


def send_raw(url: str, request_line: bytes, headers: list[bytes], body: bytes = CHAT_BODY) -> bytes:
    """One request on its own connection, its request line and headers exactly as given
    (bytes that are not UTF-8 included), and the whole answer as it came."""
    host, port = url.removeprefix("http://").split(":")
    head = [
        request_line,
        b"Host: proxy",
        b"Connection: close",
        b"Content-Type: application/json",
        b"Content-Length: " + str(len(body)).encode(),
        *headers,
    ]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])
