"""Reading an Anthropic Messages request into a `GenerationRequest` and its prompt's block
boundaries, with 400s worded as Anthropic's API words them (`field: problem`).

The prompt renders in Anthropic's cache order, tools then system then messages, each
content block ending at a boundary; a block carrying `cache_control` marks its boundary
(emulator.breakpoint_cache). Turn N+1 renders as turn N's prompt plus the answer and the new
messages, so prefix caches hit as they would on a real engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.emulator.breakpoint_cache import Breakpoints
from kvmigrate.emulator.errors import bad_request
from kvmigrate.emulator.parsing import GenerationRequest, require_object
from kvmigrate.emulator.tokens import IM_END, IM_START, MEDIA_PART_TOKENS, tokenize
from kvmigrate.emulator.tools import ToolPolicy, ToolSpec

JSON = dict[str, Any]
ROLES = ("user", "assistant")


@dataclass
class _Prompt:
    tokens: list[str] = field(default_factory=list)
    boundaries: list[int] = field(default_factory=list)
    marked: set[int] = field(default_factory=set)

    def add(self, pieces: list[str], block: Any) -> None:
        self.tokens.extend(pieces)
        self.boundaries.append(len(self.tokens))
        if isinstance(block, Mapping) and block.get("cache_control") is not None:
            self.marked.add(len(self.tokens))


def parse_messages(raw: Any, *, count_only: bool = False) -> tuple[GenerationRequest, Breakpoints]:
    body = require_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model: Field required")
    max_tokens = body.get("max_tokens")
    if not count_only and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise bad_request("max_tokens: Field required")
    if isinstance(max_tokens, int) and max_tokens < 1:
        raise bad_request("max_tokens: Input should be greater than or equal to 1")
    messages = _messages(body)
    tools = _tools(body.get("tools"))
    prompt = _Prompt()
    for tool in body.get("tools") or ():
        spec = {k: v for k, v in tool.items() if k != "cache_control"}
        prompt.add(tokenize("# Tool\n" + json.dumps(spec, sort_keys=True)), tool)
    _system(prompt, body.get("system"))
    for message in messages:
        _message(prompt, message)
    prompt.tokens.extend([IM_START, "assistant", "\n"])
    last = messages[-1]
    results = _tool_results(last)
    req = GenerationRequest(
        model=model,
        prompt=prompt.tokens,
        topic_text=_user_text(messages),
        last_role="tool" if last["role"] == "user" and results else str(last["role"]),
        stream=body.get("stream") is True,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        stop=_stop_sequences(body.get("stop_sequences")),
        temperature=_temperature(body.get("temperature")),
        tools=_tool_policy(body.get("tool_choice"), tools),
    )
    return req, Breakpoints(tuple(prompt.boundaries), frozenset(prompt.marked))


def _messages(body: JSON) -> list[JSON]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages: Field required")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(f"messages.{index}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if not isinstance(content, str | list):
            raise bad_request(f"messages.{index}.content: Field required")
    return messages


def _blocks(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _block_text(block: Any) -> str:
    if not isinstance(block, Mapping):
        return ""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text") or "")
    if kind == "tool_use":
        arguments = json.dumps(block.get("input") or {}, sort_keys=True)
        return f'<tool_call>{{"name": "{block.get("name")}", "arguments": {arguments}}}</tool_call>'
    if kind == "tool_result":
        return "<tool_response>" + _result_text(block.get("content")) + "</tool_response>"
    if kind == "thinking":
        return str(block.get("thinking") or "")
    return ""


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_block_text(part) for part in content)
    return ""


def _system(prompt: _Prompt, system: Any) -> None:
    if system is None:
        return
    if not isinstance(system, str | list):
        raise bad_request("system: Input should be a valid string or a list of text blocks")
    blocks = _blocks(system)
    for index, block in enumerate(blocks):
        pieces = tokenize(_block_text(block))
        if index == 0:
            pieces = [IM_START, "system", "\n", *pieces]
        if index == len(blocks) - 1:
            pieces += [IM_END, "\n"]
        prompt.add(pieces, block)


def _message(prompt: _Prompt, message: JSON) -> None:
    blocks = _blocks(message["content"]) or [{"type": "text", "text": ""}]
    for index, block in enumerate(blocks):
        media = isinstance(block, Mapping) and block.get("type") in ("image", "document")
        pieces = ["<|media|>"] * MEDIA_PART_TOKENS if media else tokenize(_block_text(block))
        if index == 0:
            pieces = [IM_START, str(message["role"]), "\n", *pieces]
        if index == len(blocks) - 1:
            pieces += [IM_END, "\n"]
        prompt.add(pieces, block)


def _tool_results(message: JSON) -> list[Any]:
    return [
        b
        for b in _blocks(message["content"])
        if isinstance(b, Mapping) and b.get("type") == "tool_result"
    ]


def _user_text(messages: list[JSON]) -> str:
    for message in reversed(messages):
        if message["role"] == "user":
            return "".join(_block_text(b) for b in _blocks(message["content"]))
    return ""


def _tools(raw: Any) -> tuple[ToolSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad_request("tools: Input should be a valid list")
    specs = []
    for index, tool in enumerate(raw):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad_request(f"tools.{index}.name: Field required")
        if "type" in tool and tool["type"] != "custom":
            continue  # a server tool (web search, code execution): never called here
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise bad_request(f"tools.{index}.custom.input_schema: Field required")
        specs.append(ToolSpec(tool["name"], str(tool.get("description") or ""), schema))
    return tuple(specs)


def _tool_policy(choice: Any, tools: tuple[ToolSpec, ...]) -> ToolPolicy:
    if choice is None:
        return ToolPolicy(tools, "auto")
    kind = choice.get("type") if isinstance(choice, dict) else None
    parallel = not (isinstance(choice, dict) and choice.get("disable_parallel_tool_use"))
    if kind in ("auto", "none"):
        return ToolPolicy(tools, str(kind), None, parallel)
    if kind == "any":
        return ToolPolicy(tools, "required", None, parallel)
    if kind == "tool":
        name = choice.get("name") if isinstance(choice, dict) else None
        if not any(t.name == name for t in tools):
            raise bad_request(f"tool_choice.tool.name: no tool named {name!r} in tools")
        return ToolPolicy(tools, "required", str(name), parallel)
    raise bad_request("tool_choice: Input tag does not match 'auto', 'any', 'tool' or 'none'")


def _stop_sequences(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, list) and all(isinstance(s, str) for s in raw):
        return tuple(raw)
    raise bad_request("stop_sequences: Input should be a valid list of strings")


def _temperature(raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0.0 <= raw <= 1.0:
        raise bad_request("temperature: Input should be a number between 0 and 1")
    return float(raw)
