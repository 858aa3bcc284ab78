"""Deterministic tool calls, so an agent loop runs user -> tool call -> tool result -> answer.

Whether to call: never with `tool_choice: none`; always with `required` or a named function;
with `auto`, exactly when the last message is the user's (after a tool result the model
answers in text). Which tools: the named one; else, when parallel calls are allowed, every
tool whose name the last user message mentions; else the one whose name and description
share the most words with that message (the first tool on a tie). Arguments come from the
tool's JSON schema, filled with the message's words.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.emulator.schema_values import SchemaValues
from kvmigrate.emulator.textgen import topic_words
from kvmigrate.emulator.tokens import words


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """The request's tool settings. `mode` is none, auto or required; `forced` a tool name."""

    tools: tuple[ToolSpec, ...] = ()
    mode: str = "auto"
    forced: str | None = None
    parallel: bool = True


@dataclass(frozen=True, slots=True)
class PlannedCall:
    name: str
    arguments: str


def _mentions(tool: ToolSpec, text: str) -> bool:
    lowered = text.lower()
    return tool.name.lower() in lowered or tool.name.replace("_", " ").lower() in lowered


def _score(tool: ToolSpec, message_words: set[str]) -> int:
    tool_words = {w.lower() for w in words(tool.name.replace("_", " ") + " " + tool.description)}
    return len(tool_words & message_words)


def select_tools(policy: ToolPolicy, last_role: str, last_user_text: str) -> list[ToolSpec]:
    if not policy.tools or policy.mode == "none":
        return []
    if policy.forced is not None:
        return [t for t in policy.tools if t.name == policy.forced][:1]
    if policy.mode == "auto" and last_role != "user":
        return []
    if policy.parallel:
        mentioned = [t for t in policy.tools if _mentions(t, last_user_text)]
        if mentioned:
            return mentioned
    message_words = {w.lower() for w in words(last_user_text)}
    best = max(policy.tools, key=lambda t: _score(t, message_words))
    return [best]


def plan_calls(
    tools: Sequence[ToolSpec], last_user_text: str, rng: random.Random
) -> list[PlannedCall]:
    vocabulary = topic_words(last_user_text, limit=12)
    calls = []
    for tool in tools:
        schema = tool.parameters or {"type": "object", "properties": {}}
        arguments = SchemaValues(schema, vocabulary, rng).value()
        calls.append(PlannedCall(tool.name, json.dumps(arguments)))
    return calls
