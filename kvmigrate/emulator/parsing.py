"""Reading request bodies into one `GenerationRequest`, with OpenAI-style 400s for bad input.

Validation covers what changes the answer or its shape; unknown fields are accepted and
ignored, as both real servers do.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.emulator.errors import bad_request
from kvmigrate.emulator.tokens import content_text, render_chat, tokenize
from kvmigrate.emulator.tools import ToolPolicy, ToolSpec

JSON = dict[str, Any]
MAX_N = 128


# Seeds the noise stream of an unseeded call (`GenerationRequest.noise_seed`).
NOISE_SEED_HEADER = "x-emulator-noise-seed"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the emulator needs from a chat, completion or responses request.

    `topic_text` is the text answers reuse words of (the last user message); `prompt_key`
    identifies the prompt for deterministic generation."""

    model: str
    prompt: Sequence[str]
    topic_text: str
    last_role: str
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    temperature: float | None = None
    # Seeds only the noise stream of an unseeded call (`x-emulator-noise-seed`): two calls
    # still differ as two samples do, but a test bed can replay them exactly.
    noise_seed: int | None = None
    tools: ToolPolicy = field(default_factory=ToolPolicy)
    json_mode: bool = False
    json_schema: Mapping[str, Any] | None = None

    @property
    def prompt_key(self) -> str:
        return hashlib.blake2b("".join(self.prompt).encode(), digest_size=16).hexdigest()


def require_object(body: Any) -> JSON:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def require_model(body: JSON) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("you must provide a model parameter", param="model")
    return model


def _int(body: JSON, key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"Invalid type for '{key}': expected an integer.", key, "invalid_type")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if value < low else f"<= {high}"
        message = f"Invalid '{key}': expected a value {bound}, but got {value} instead."
        raise bad_request(message, key, "invalid_value")
    return value


def _float(body: JSON, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise bad_request(f"Invalid type for '{key}': expected a number.", key, "invalid_type")
    if not low <= value <= high:
        message = f"Invalid '{key}': expected a value between {low} and {high}, got {value}."
        raise bad_request(message, key, "invalid_value")
    return float(value)


def _stop(body: JSON) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        return tuple(stop)
    raise bad_request("Invalid 'stop': expected a string or up to 4 strings.", "stop")


def _streaming(body: JSON) -> tuple[bool, bool]:
    stream = body.get("stream") is True
    options = body.get("stream_options")
    if options is not None and not stream:
        message = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        raise bad_request(message, "stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return stream, include_usage


def parse_tools(raw: Any, flat: bool = False) -> tuple[ToolSpec, ...]:
    """Chat tools (`{"type": "function", "function": {...}}`) or, with `flat`, Responses
    tools (`{"type": "function", "name": ...}`); other tool types are ignored."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad_request("Invalid 'tools': expected an array.", "tools")
    specs = []
    for index, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        function = tool if flat else tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise bad_request(f"Missing required parameter: 'tools[{index}].function.name'.")
        assert isinstance(function, dict)
        parameters = function.get("parameters")
        specs.append(
            ToolSpec(
                name=name,
                description=str(function.get("description") or ""),
                parameters=parameters if isinstance(parameters, dict) else {},
            )
        )
    return tuple(specs)


def tool_policy(body: JSON, tools: tuple[ToolSpec, ...], flat: bool = False) -> ToolPolicy:
    choice = body.get("tool_choice", "auto")
    parallel = body.get("parallel_tool_calls") is not False
    if isinstance(choice, str) and choice in ("none", "auto", "required"):
        return ToolPolicy(tools, choice, None, parallel)
    if isinstance(choice, dict):
        function = choice if flat or "name" in choice else choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str) and any(t.name == name for t in tools):
            return ToolPolicy(tools, "required", name, parallel)
        raise bad_request(f"Invalid 'tool_choice': no tool named {name!r}.", "tool_choice")
    raise bad_request("Invalid 'tool_choice': expected none, auto, required or a function.")


def response_format(raw: Any) -> tuple[bool, Mapping[str, Any] | None]:
    """(JSON mode, schema) from a chat `response_format` or a Responses `text.format`."""
    if raw is None:
        return False, None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return False, None
    if kind == "json_object":
        return True, None
    if kind == "json_schema":
        assert isinstance(raw, dict)
        holder = raw.get("json_schema", raw)
        schema = holder.get("schema") if isinstance(holder, dict) else None
        if not isinstance(schema, dict):
            raise bad_request("Missing required parameter: 'response_format.json_schema'.")
        return True, schema
    raise bad_request("Invalid 'response_format.type'.", "response_format.type")


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def _messages(body: JSON) -> list[JSON]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("Invalid 'messages': expected a non-empty array.", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"Missing required parameter: 'messages[{index}].role'.")
    return messages


def _sampling(body: JSON, max_keys: tuple[str, ...]) -> JSON:
    max_tokens = None
    for key in max_keys:
        max_tokens = _int(body, key, 1)
        if max_tokens is not None:
            break
    return {
        "max_tokens": max_tokens,
        "n": _int(body, "n", 1, MAX_N) or 1,
        "stop": _stop(body),
        "seed": _int(body, "seed", -(2**63)),
        "temperature": _float(body, "temperature", 0.0, 2.0),
    }


def parse_chat(raw: Any) -> GenerationRequest:
    body = require_object(raw)
    model = require_model(body)
    messages = _messages(body)
    tools = parse_tools(body.get("tools"))
    stream, include_usage = _streaming(body)
    json_mode, schema = response_format(body.get("response_format"))
    raw_tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    return GenerationRequest(
        model=model,
        prompt=render_chat(messages, raw_tools),
        topic_text=last_user_text(messages),
        last_role=str(messages[-1]["role"]),
        stream=stream,
        include_usage=include_usage,
        tools=tool_policy(body, tools),
        json_mode=json_mode,
        json_schema=schema,
        **_sampling(body, ("max_completion_tokens", "max_tokens")),
    )


def parse_completion(raw: Any) -> GenerationRequest:
    body = require_object(raw)
    model = require_model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        prompt_tokens, text = [str(t) for t in prompt], ""
    elif isinstance(prompt, str):
        prompt_tokens, text = tokenize(prompt), prompt
    else:
        raise bad_request("Invalid 'prompt': expected a string or token ids.", "prompt")
    stream, include_usage = _streaming(body)
    sampling = _sampling(body, ("max_tokens",))
    if sampling["max_tokens"] is None:
        sampling["max_tokens"] = 16  # the legacy endpoint's documented default
    return GenerationRequest(
        model=model,
        prompt=prompt_tokens,
        topic_text=text,
        last_role="user",
        stream=stream,
        include_usage=include_usage,
        **sampling,
    )
