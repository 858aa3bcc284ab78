"""A deterministic approximate tokenizer and a ChatML-like rendering of chat requests.

Real tokenizers average about four characters of English per token. Splitting words into
pieces of at most four word characters, each with its leading whitespace, lands close to that
and, unlike a real tokenizer, costs no model download. A token here is its text piece, so a
token list can be hashed for prefix caching and joined back into the text.

The chat rendering matters for caching: turn N+1 of a conversation renders as turn N's prompt
followed by the assistant's answer and the new messages, so the shared prefix hits the cache,
as it does in vLLM with a real chat template.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvmigrate.wire.content import content_text as wire_content_text

_PIECE = re.compile(r"\s*\w{1,4}|\s*[^\w\s]|\s+")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]{2,}")

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# A non-text content part (image, audio, file) costs a fixed number of tokens.
MEDIA_PART_TOKENS = 85


def tokenize(text: str) -> list[str]:
    return _PIECE.findall(text)


def count_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


def words(text: str) -> list[str]:
    """Plain words of three letters or more, in order: the vocabulary answers reuse."""
    return _WORD.findall(text)


def content_text(content: Any) -> str:
    """The text of a message's `content`: a string, a list of parts, or null; a value of
    another type as its string (the emulator counts what a lax client sent)."""
    if content is None or isinstance(content, str | list):
        return wire_content_text(content)
    return str(content)


def _media_parts(content: Any) -> int:
    if not isinstance(content, list):
        return 0
    return sum(1 for part in content if isinstance(part, Mapping) and "text" not in part)


def _tool_calls_text(tool_calls: Any) -> str:
    if not isinstance(tool_calls, list):
        return ""
    rendered = []
    for call in tool_calls:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        name = function.get("name", "") if isinstance(function, Mapping) else ""
        arguments = function.get("arguments", "") if isinstance(function, Mapping) else ""
        rendered.append(f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>')
    return "".join(rendered)


def _block(role: str, text: str, media_parts: int = 0) -> list[str]:
    tokens = [IM_START, role, "\n"]
    tokens.extend(["<|media|>"] * (media_parts * MEDIA_PART_TOKENS))
    tokens.extend(tokenize(text))
    tokens.extend([IM_END, "\n"])
    return tokens


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Iterable[Mapping[str, Any]] = (),
    add_generation_prompt: bool = True,
) -> list[str]:
    """Prompt tokens of a chat request: tools first (as chat templates put them in the system
    turn), then each message, then the assistant's generation prompt."""
    tokens: list[str] = []
    tool_list = list(tools)
    if tool_list:
        tokens.extend(_block("system", "# Tools\n" + json.dumps(tool_list, sort_keys=True)))
    for message in messages:
        role = str(message.get("role", "user"))
        content = message.get("content")
        text = content_text(content) + _tool_calls_text(message.get("tool_calls"))
        tokens.extend(_block(role, text, _media_parts(content)))
    if add_generation_prompt:
        tokens.extend([IM_START, "assistant", "\n"])
    return tokens
