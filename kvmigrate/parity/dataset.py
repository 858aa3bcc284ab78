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

import orjson

ROUTES = ("chat/completions", "completions", "responses", "messages")


class DatasetError(ValueError):
    """A line that is not a usable request, with the file and line number."""


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


def parse_line(text: str, where: str, index: int) -> DatasetItem:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise DatasetError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{where}: expected a JSON object")
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
    items = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DatasetError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text: {exc.reason}") from None
    for number, line in enumerate(lines, start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            items.append(parse_line(line, f"{path}:{number}", number))
    if not items:
        raise DatasetError(f"{path}: no requests")
    return items
