"""Export recorded requests as OpenAI Batch-style JSONL, the input of an offline replay."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

import orjson

from kvmigrate.parity.dataset import ROUTES as REPLAYABLE
from kvmigrate.recorder.history import inflate_rows
from kvmigrate.recorder.store import RecordStore

PAGE = 1000
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def recorded_requests(
    store: RecordStore, since: float, until: float, routes: Iterable[str] = REPLAYABLE
) -> Iterator[dict[str, Any]]:
    """One line per served call with stored content, oldest first:
    `{"custom_id", "method", "url", "body", "metadata"}` (the OpenAI Batch input shape);
    `metadata.usage` holds the record's prompt, completion and cached token counts.

    Only serve calls: a shadow copy is the same request again. The body's `model` is the
    client's model name (the stored body carries the backend's), so a replay routes it as
    the client did. `routes`: the replayable ones unless told (Messages bodies are not
    replayed, but the cache-buster analysis reads them)."""
    routes = sorted(routes)
    where = (
        "WHERE ts >= ? AND ts < ? AND role = 'serve' AND request_json IS NOT NULL "
        f"AND route IN ({', '.join('?' for _ in routes)}) "
    )
    select = (
        "SELECT request_id, route, model, conversation, turn, backend, request_json, "
        "request_messages, ts, prompt_tokens, completion_tokens, cached_tokens FROM records "
    )
    first = select + where + "ORDER BY ts, request_id LIMIT ?"
    # Each page starts after the last row of the one before (by its sort key), not at an
    # offset: a proxy writing while the export runs cannot shift rows into a page twice.
    after = (
        select
        + where
        + "AND (ts > ? OR (ts = ? AND request_id > ?)) ORDER BY ts, request_id LIMIT ?"
    )
    page = store.query(first, (since, until, *routes, PAGE))
    while page:
        yield from _lines(store, page)
        if len(page) < PAGE:
            return
        last_id, last_ts = page[-1][0], page[-1][8]
        page = store.query(after, (since, until, *routes, last_ts, last_ts, last_id, PAGE))


def _lines(store: RecordStore, page: list[Any]) -> Iterator[dict[str, Any]]:
    bodies = inflate_rows(store, [(row[6], row[7]) for row in page])
    for row, body in zip(page, bodies, strict=True):
        if body is None:
            continue  # its history did not survive a failed write: not replayable
        line = request_line(row, body)
        # The record's own token counts: `kvmigrate plan --dataset` takes an answer's length
        # and the prompt's size from them (a request's max_tokens is only a cap).
        usage = dict(zip(USAGE_KEYS, row[9:12], strict=True))
        if any(v is not None for v in usage.values()):
            line["metadata"]["usage"] = {k: v for k, v in usage.items() if v is not None}
        yield line


def request_line(row: Sequence[Any], body: dict[str, Any]) -> dict[str, Any]:
    """A record's request as a batch-file line: its row's leading columns (request id,
    route, model, conversation, turn, backend) and its rebuilt body."""
    request_id, route, model, conversation, turn, backend = row[:6]
    body["model"] = model
    return {
        "custom_id": request_id,
        "method": "POST",
        "url": f"/v1/{route}",
        "body": body,
        "metadata": {"conversation": conversation, "turn": turn, "backend": backend},
    }


def export_requests(store: RecordStore, since: float, until: float, out: TextIO) -> int:
    count = 0
    for line in recorded_requests(store, since, until):
        out.write(orjson.dumps(line).decode() + "\n")
        count += 1
    return count
