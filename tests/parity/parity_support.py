"""Helpers for the parity tests: emulators, OpenAI-shaped answers, configs and datasets."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer

HOSTED_MODEL = "gpt-4o-mini"
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
JSON = dict[str, Any]


@contextmanager
def emulator(
    profile: str, seen_keys: list[str] | None = None, **overrides: Any
) -> Iterator[BackgroundServer]:
    """An emulator answering at once; `seen_keys` collects every Authorization header."""
    overrides.setdefault("time_scale", 0.0)
    settings = EmulatorSettings(profile=profile, **overrides)  # type: ignore[arg-type]

    @web.middleware
    async def record_keys(request: web.Request, handler: Callable[..., Any]) -> Any:
        if seen_keys is not None:
            seen_keys.append(request.headers.get("Authorization", ""))
        return await handler(request)

    def factory() -> web.Application:
        app = build_app(settings)
        app.middlewares.insert(0, record_keys)
        return app

    server = BackgroundServer(factory).start()
    try:
        yield server
    finally:
        server.stop()


def chat_response(
    content: str | None = "Paris is the capital of France.",
    *,
    finish: str = "stop",
    tool_calls: list[JSON] | None = None,
    refusal: str | None = None,
    **extra: Any,
) -> JSON:
    """A non-streamed chat completion as OpenAI sends it."""
    message: JSON = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1,
        "model": HOSTED_MODEL,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        **extra,
    }


def tool_call(name: str, arguments: JSON | str, call_id: str = "call_abcdefghijkl") -> JSON:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def write_config(
    path: Path,
    hosted_url: str,
    vllm_url: str,
    *,
    hosted_key: str | None = None,
    vllm_key: str | None = None,
) -> Path:
    hosted_key_line = f"\n    api_key: {hosted_key}" if hosted_key else ""
    vllm_key_line = f"\n    api_key: {vllm_key}" if vllm_key else ""
    path.write_text(
        f"""
backends:
  hosted:
    api_base: {hosted_url}/v1{hosted_key_line}
  vllm:
    api_base: {vllm_url}/v1{vllm_key_line}
models:
  - model_name: {HOSTED_MODEL}
    hosted: {HOSTED_MODEL}
    vllm: {VLLM_MODEL}
rollout:
  primary: hosted
  candidate: vllm
  state: sqlite:///{path.parent}/state.db
record:
  db: sqlite:///{path.parent}/records.db
"""
    )
    return path


def write_dataset(path: Path, bodies: list[JSON], batch: bool = False) -> Path:
    lines = []
    for index, body in enumerate(bodies):
        if batch:
            line = {"custom_id": f"req-{index}", "method": "POST",
                    "url": "/v1/chat/completions", "body": body, "metadata": {}}  # fmt: skip
        else:
            line = body
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    return path


def chat_requests(count: int) -> list[JSON]:
    """Text, tool and JSON requests in turn, about different subjects."""
    subjects = ["volcanoes", "glaciers", "sourdough", "telescopes", "bicycles", "chess"]
    tools = [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather",
         "parameters": {"type": "object", "required": ["city"],
                        "properties": {"city": {"type": "string"}}}}},
    ]  # fmt: skip
    bodies = []
    for index in range(count):
        subject = subjects[index % len(subjects)]
        body: JSON = {
            "model": HOSTED_MODEL,
            "messages": [{"role": "user", "content": f"Explain the history of {subject}."}],
        }
        if index % 3 == 1:
            body["messages"][0]["content"] = f"What is the weather in Paris near {subject}?"
            body["tools"] = tools
            body["tool_choice"] = "required"
        elif index % 3 == 2:
            body["response_format"] = {"type": "json_object"}
            body["stream"] = True
        bodies.append(body)
    return bodies
