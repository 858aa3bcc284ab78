"""Conversation identity and turn index: which requests belong to one agent conversation.

Prefix caching pays off only when every turn of a conversation reaches the same warm engine,
so the key must be stable across turns: turn N resends turn 1's system prompt and first
user message unchanged, while everything after them grows. Timestamps, dates and ids in that
opening are masked before hashing: a system prompt that says `Current time: ...` changes every
turn, and must not make every turn a new conversation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from kvmigrate.policies.volatile import mask_volatile
from kvmigrate.wire.anthropic import MESSAGES_ROUTES

SESSION_HEADER = "x-session-id"
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class ConversationKey:
    value: str
    source: str  # "header" | "user" | "prefix" | "body"


def conversation_key(
    headers: Mapping[str, str], body: Mapping[str, Any], model: str
) -> ConversationKey:
    """The X-Session-ID header, else the request's `user`, else a hash of the stable prefix."""
    declared = declared_key(headers, body)
    return declared if declared is not None else derived_key(body, model)


def derived_key(body: Mapping[str, Any], model: str) -> ConversationKey:
    """The key of a request that declares none: a hash of its stable prefix (its masked
    opening), else of its whole input."""
    anchor = _stable_prefix(body)
    source = "prefix" if anchor is not None else "body"
    if anchor is None:
        # No messages (embeddings, completions): the whole input identifies the request.
        anchor = [body.get("input"), body.get("prompt")]
    digest = hashlib.blake2b(
        orjson.dumps([model, anchor], option=orjson.OPT_SORT_KEYS), digest_size=12
    ).hexdigest()
    return ConversationKey("h:" + digest, source)


def is_derived_key(conversation: str) -> bool:
    """`h:` and 24 hex digits, as `conversation_key` makes them: a digest of the opening,
    which names nobody (a declared key, from a header or `user`, may be an email)."""
    body = conversation[2:]
    return conversation.startswith("h:") and len(body) == 24 and set(body) <= _HEX


def _as_text(value: str) -> str:
    """aiohttp decodes header bytes that are not UTF-8 to lone surrogates, which no hash,
    store or log can encode: they become U+FFFD, the same for every turn of the session."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def declared_key(
    headers: Mapping[str, str], body: Mapping[str, Any], route: str = ""
) -> ConversationKey | None:
    """The key the client states: the X-Session-ID header, else the request's `user`, else
    on Anthropic's Messages API (which has no `user`) its `metadata.user_id`. Chat's
    `metadata` is the client's free-form tags, and keys nothing."""
    session = headers.get(SESSION_HEADER)
    if session:
        return ConversationKey(session if session.isascii() else _as_text(session), "header")
    user = body.get("user")
    if isinstance(user, str) and user:
        return ConversationKey("user:" + user, "user")
    metadata = body.get("metadata") if route in MESSAGES_ROUTES else None
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(user, str) and user:
        return ConversationKey("user:" + user, "user")
    return None


def _stable_prefix(body: Mapping[str, Any]) -> list[Any] | None:
    """System messages plus the first user message: what every later turn resends unchanged.
    Anthropic's Messages API has its system prompt in a top-level `system`."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = body.get("input") if isinstance(body.get("input"), list) else None
    if not messages:
        instructions = body.get("instructions")
        if instructions is None:
            return None
        text = body.get("input")
        if isinstance(text, str):
            # A Responses request with string `input`: keyed by the instructions alone,
            # every conversation sharing them would be one conversation.
            return [["instructions", masked(instructions)], ["user", masked(text)]]
        return [instructions]
    prefix: list[Any] = []
    if "system" in body:
        prefix.append(["system", masked(body.get("system"))])
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in ("system", "developer"):
            prefix.append([role, masked(message.get("content"))])
        elif role == "user":
            prefix.append(["user", masked(message.get("content"))])
            break
    if "instructions" in body:
        prefix.append(["instructions", masked(body.get("instructions"))])
    return prefix or None


def masked(content: Any) -> Any:
    """Content with its volatile spans masked; content without any is returned as it came,
    so keys of openings without timestamps or ids are the same as before masking existed."""
    if isinstance(content, str):
        return mask_volatile(content)
    if isinstance(content, list):
        return [_masked_part(part) for part in content]
    return content


def _masked_part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    if "cache_control" in part:
        # Anthropic's cache breakpoint is a marker, not content: agents move it to their
        # newest message each turn, off the opening that turn 1 carried it on.
        part = {k: v for k, v in part.items() if k != "cache_control"}
    if isinstance(part.get("text"), str):
        return {**part, "text": mask_volatile(part["text"])}
    return part


def turn_index(body: Mapping[str, Any]) -> int:
    """1 for the first request of a conversation; each earlier answer resent adds one."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        items = body.get("input")
        return _resent_answers(items) + 1 if isinstance(items, list) else 1
    answers = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    return answers + 1


# Responses API output items a stateless client resends as its history.
_OUTPUT_ITEMS = frozenset({"function_call", "reasoning", "web_search_call", "file_search_call"})


def _resent_answers(items: list[Any]) -> int:
    """The answers a Responses `input` list resends: a run of assistant messages and output
    items (an answer's reasoning, text and tool calls) is one answer."""
    answers = 0
    previous = False
    for item in items:
        if not isinstance(item, dict):
            previous = False
            continue
        kind = item.get("type", "message")
        output = item.get("role") == "assistant" if kind == "message" else kind in _OUTPUT_ITEMS
        answers += output and not previous
        previous = output
    return answers
