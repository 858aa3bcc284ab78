"""The replay dataset: JSONL, one request per line.

A line is either a bare OpenAI request body (`{"model": ..., "messages": [...]}`) or the
OpenAI Batch input shape that `kvmigrate report --export-requests` writes:
`{"custom_id", "method", "url": "/v1/chat/completions", "body": {...}, "metadata"}`. An
Anthropic Messages request needs that shape (`"url": "/v1/messages"`): a bare body with
`messages` reads as a chat request.
Blank lines and lines starting with `#` are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmigrate.datasets import DatasetError, jsonl_objects

ROUTES = ("chat/completions", "completions", "responses", "messages")


@dataclass(frozen=True, slots=True)
class DatasetItem:
    id: str
    route: str
    body: dict[str, Any]


def route_of(body: dict[str, Any], url: str | None) -> str | None:
    if url:
        path = url.split("?", 1)[0].strip("/")
        path = path.removeprefix("v1/")
        return path if path in ROUTES else None
    if "messages" in body:
        return "chat/completions"
    if "input" in body:
        return "responses"
    return "completions" if "prompt" in body else None


def dataset_item(data: dict[str, Any], where: str, index: int) -> DatasetItem:
    """A line's object as a request, with its id (`custom_id`, else `line-N`)."""
    batch = isinstance(data.get("body"), dict)
    body = data["body"] if batch else data
    url = data.get("url") if batch else None
    route = route_of(body, url if isinstance(url, str) else None)
    if route is None:
        raise DatasetError(f"{where}: not a chat, completions or responses request")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise DatasetError(f"{where}: the request has no model")
    custom = data.get("custom_id") if batch else None
    return DatasetItem(custom if isinstance(custom, str) else f"line-{index}", route, body)


def load_dataset(path: str | Path) -> list[DatasetItem]:
    items = [
        dataset_item(data, where, number)
        for number, where, data in jsonl_objects(path, comments=True)
    ]
    if not items:
        raise DatasetError(f"{path}: no requests")
    return items
