"""A stored response's input items, as `GET /v1/responses/{id}/input_items` lists them: the
items the response was answered from (those of the responses it continues, their outputs,
then its own input), each with an id, in OpenAI's list shape and pagination (`order`,
default `desc`; `limit`, 1-100, default 20; `after`, an item id)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kvmigrate.emulator.errors import bad_request
from kvmigrate.emulator.wire import JSON

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def own_items(body: JSON, new_id: Callable[[], str]) -> list[JSON]:
    """A request's own input as stored items: text is a user message; each item keeps its
    fields, gains an id if it had none, and a message's text becomes content parts."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [_message({"role": "user", "content": raw}, new_id)]
    items = raw if isinstance(raw, list) else []
    return [_item(item, new_id) for item in items if isinstance(item, dict)]


def _item(item: JSON, new_id: Callable[[], str]) -> JSON:
    kind = str(item.get("type", "message"))
    if kind == "message":
        return _message(item, new_id)
    prefix = _ID_PREFIXES.get(kind, "item")
    return {**item, "id": item.get("id") or f"{prefix}_{new_id()}"}


def _message(item: JSON, new_id: Callable[[], str]) -> JSON:
    role = str(item.get("role", "user"))
    content = item.get("content")
    if isinstance(content, str):
        part = "output_text" if role == "assistant" else "input_text"
        extra: JSON = {"annotations": []} if role == "assistant" else {}
        content = [{"type": part, "text": content, **extra}]
    return {
        "id": item.get("id") or f"msg_{new_id()}",
        "type": "message",
        "status": item.get("status", "completed"),
        "role": role,
        "content": content,
    }


def page(items: list[JSON], query: Mapping[str, str]) -> JSON:
    """One page of `items` (oldest first) as the API lists them."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"Invalid value for 'order': {order[:40]!r}.", "order")
    try:
        limit = int(query.get("limit", DEFAULT_LIMIT))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        message = f"Invalid 'limit': expected an integer from 1 to {MAX_LIMIT}."
        raise bad_request(message, "limit")
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after := query.get("after"):
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise bad_request(f"No item with id '{after[:64]}' in this list.", "after")
        start = ids.index(after) + 1
    data = ordered[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }
