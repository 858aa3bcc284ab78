"""Read conversations from JSONL, in every shape a team is likely to have at hand.

Each line is one of:
- a whole conversation: `{"conversation": id, "turns": [body | {"request": body, "response": r}]}`;
- one request with its conversation id: `{"conversation_id" | "session_id" | "conversation" |
  "user": id, "body": body, "response": r?}`;
- a line of `kvmigrate report --export-requests` (OpenAI Batch shape: `{"custom_id", "url",
  "body", "metadata": {"conversation", "turn"}}`) or a recorded row (`request_json`,
  `response_json`, `conversation`, `turn`, `role`, `ts`);
- a bare request body `{"messages": [...]}`, grouped by its `user`, else by its model and
  first user message (not its system prompt: a changing system prompt is what we look for).

A body is a chat request or an Anthropic Messages one (`system`, content blocks; see
kvmigrate.cachecheck.messages_view). Requests of one conversation keep their order in the
file, unless they all carry `ts` (or `turn`) to sort by. Shadow copies and other requests
(embeddings, responses) are skipped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kvmigrate.cachecheck.analyze import Conversation, Turn
from kvmigrate.cachecheck.render import content_text
from kvmigrate.datasets import DatasetError, json_objects, jsonl_objects
from kvmigrate.exchange import Role

ID_KEYS = ("conversation_id", "session_id", "conversation", "user")


@dataclass(frozen=True, slots=True)
class Item:
    """One request line, read: the conversation it belongs to and where in it."""

    conversation: str
    turn: Turn
    ts: float | None
    number: int | None


@dataclass(slots=True)
class Dataset:
    conversations: list[Conversation]
    skipped: int = 0  # lines that are not chat requests (shadow copies, other routes)


def load_dataset(path: str | Path) -> Dataset:
    return _dataset(jsonl_objects(path), str(path))


def parse_lines(lines: Iterable[str], name: str = "<input>") -> Dataset:
    return _dataset(json_objects(lines, name), name)


def _dataset(objects: Iterable[tuple[int, str, dict[str, Any]]], name: str) -> Dataset:
    whole: list[Conversation] = []
    items: dict[str, list[Item]] = {}
    skipped = 0
    for _, where, data in objects:
        if isinstance(data.get("turns"), list):
            whole.append(_conversation(data, where, len(whole) + len(items)))
            continue
        item = line_item(data, where)
        if item is None:
            skipped += 1
        else:
            items.setdefault(item.conversation, []).append(item)
    conversations = whole + [
        Conversation(key, ordered_turns(group)) for key, group in items.items()
    ]
    if not conversations:
        raise DatasetError(f"{name}: no chat requests found")
    return Dataset(conversations, skipped)


def _conversation(data: Mapping[str, Any], where: str, position: int) -> Conversation:
    turns = []
    for i, raw in enumerate(data["turns"]):
        if not isinstance(raw, Mapping):
            raise DatasetError(f"{where}: turns[{i}] is not an object")
        request, response = _request_response(raw)
        if request is None:
            raise DatasetError(f"{where}: turns[{i}] has no `messages` list")
        turns.append(Turn(request, response))
    return Conversation(_id(data) or f"conversation-{position + 1}", turns)


def line_item(data: Mapping[str, Any], where: str) -> Item | None:
    """A request line read as `parse_lines` reads it; None for a line it skips. Public so
    that a reader of recorded requests that groups them itself reads each the same way."""
    if data.get("role") == Role.SHADOW:
        return None
    url = data.get("url")
    if isinstance(url, str) and not url.rstrip("/").endswith(("chat/completions", "/messages")):
        return None
    if not any(k in data for k in ("messages", "body", "request", "request_json")):
        raise DatasetError(
            f"{where}: not a request: expected `messages`, `body`, `request`, `request_json` "
            "or `turns`"
        )
    request, response = _request_response(data)
    if request is None:
        # A recorded non-chat call (embeddings, responses) or a record kept without content.
        return None
    raw_metadata = data.get("metadata")
    metadata: Mapping[str, Any] = raw_metadata if isinstance(raw_metadata, Mapping) else {}
    key = _id(data) or _id(metadata) or _id(request) or _anchor(request)
    turn = data.get("turn", metadata.get("turn"))
    ts = data.get("ts")
    return Item(
        key,
        Turn(request, response),
        float(ts) if isinstance(ts, int | float) else None,
        turn if isinstance(turn, int) else None,
    )


def _request_response(
    data: Mapping[str, Any],
) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    request: Any = data
    for key in ("body", "request", "request_json"):
        if key in data:
            request = _maybe_json(data[key])
            break
    response = None
    for key in ("response", "response_json"):
        if key in data:
            response = _maybe_json(data[key])
            break
    if not isinstance(request, Mapping) or not isinstance(request.get("messages"), list):
        return None, None
    return request, response if isinstance(response, Mapping) else None


def _maybe_json(value: Any) -> Any:
    """Recorded rows keep request and response as JSON text."""
    if isinstance(value, str | bytes):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    return value


def _id(data: Mapping[str, Any]) -> str | None:
    for key in ID_KEYS:
        value = data.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
            return str(value)
    return None


def _anchor(request: Mapping[str, Any]) -> str:
    """No id: the model and the first user message, which every later turn resends."""
    first = next(
        (m for m in request["messages"] if isinstance(m, Mapping) and m.get("role") == "user"),
        {},
    )
    seed = orjson.dumps([request.get("model"), content_text(first.get("content"))])
    return "h:" + hashlib.blake2b(seed, digest_size=8).hexdigest()


def ordered_turns(items: list[Item]) -> list[Turn]:
    """One conversation's turns: by `ts`, else by turn number, else as the lines came."""
    if all(i.ts is not None for i in items):
        items = sorted(items, key=lambda i: i.ts or 0.0)
    elif all(i.number is not None for i in items):
        items = sorted(items, key=lambda i: i.number or 0)
    return [i.turn for i in items]
