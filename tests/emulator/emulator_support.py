"""Helpers for the emulator tests: SDK clients, raw HTTP, and SSE parsing."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from openai import AsyncOpenAI, OpenAI

from kvmigrate.emulator.server import BACKEND
from kvmigrate.serving import BackgroundServer

HOSTED_MODEL = "gpt-4o-mini"
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# The `start_emulator` fixture: start(profile, **settings) -> a running server.
StartEmulator = Callable[..., BackgroundServer]


def model_of(server: BackgroundServer) -> str:
    return server.app[BACKEND].settings.served_models[0]


def profile_of(server: BackgroundServer) -> str:
    return server.app[BACKEND].settings.profile


def client(server: BackgroundServer, **kwargs: Any) -> OpenAI:
    kwargs.setdefault("api_key", "test-key")
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("timeout", 10.0)
    return OpenAI(base_url=server.url + "/v1", **kwargs)


def async_client(server: BackgroundServer, **kwargs: Any) -> AsyncOpenAI:
    kwargs.setdefault("api_key", "test-key")
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("timeout", 10.0)
    return AsyncOpenAI(base_url=server.url + "/v1", **kwargs)


def raw(
    server: BackgroundServer,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP exchange; `body` is JSON-encoded unless it is already bytes."""
    parts = urlsplit(server.url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        payload = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        connection.request(method, path, body=payload, headers=all_headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def sse_data(body: bytes) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    return [
        line[len("data: ") :] for line in body.decode().split("\n") if line.startswith("data: ")
    ]


def chat_body(server: BackgroundServer, text: str, **extra: Any) -> dict[str, Any]:
    return {"model": model_of(server), "messages": [{"role": "user", "content": text}], **extra}
