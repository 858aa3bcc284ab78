"""A chained turn with its whole context, read back from the backend that stores its chain,
for a shadow copy whose candidate has no turn to continue: the copy of the turn before was
dropped (a bound), failed, or never sent (shadowing began mid-chain).

Sent as it came, naming the candidate's id of a turn it never answered, the copy would fail;
skipped, every later turn of the chain would be skipped too, since each continues the one
before. Instead the copy goes in the stateless form: no `previous_response_id`, and as
input the items the stored turn was answered from (`GET /v1/responses/{id}/input_items`,
oldest first), that turn's output (`GET /v1/responses/{id}`), then the turn's own input.
The candidate answers from the same history as the primary did, stores the answer, and its
id becomes this turn's shadow, so the next turn's copy continues the candidate's chain.

The reads go to the backend that stores the chain, with the headers its own call carries
(in the pass-through mode, the client's key, which only the primary ever sees). Only items
any OpenAI-compatible server reads are carried over: the primary's reasoning (opaque,
encrypted for its own organisation) is left out, as another model cannot read it; a
context holding any other kind (a hosted tool's call) is not re-seeded at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import orjson

from kvmigrate.proxy.client import Response
from kvmigrate.proxy.forward import TRANSPORT_ERRORS, Call, UpstreamFailure, open_response
from kvmigrate.proxy.upstream import Upstream

log = logging.getLogger("kvmigrate.proxy.shadow")

PAGE_ITEMS = 100  # the most the API lists at once
MAX_PAGES = 20  # a longer context is not re-seeded: 2,000 items
# What a portable context holds; `reasoning` is left out (see above).
PORTABLE_ITEMS = frozenset({"message", "function_call", "function_call_output"})
LEFT_OUT_ITEMS = frozenset({"reasoning"})

ReadCall = Callable[[str], Call]  # a GET of a path below /v1 on the chain's backend
Hold = Callable[[int], bool]


class ContextUnavailable(Exception):
    """The stored turn's context could not be read, or cannot be sent to the candidate."""


class ChainContext:
    """Reads a stored turn's context from `upstream`, each call built by `read_call` (with
    the client's request's headers, for the backend that stores the chain). What the reads
    bring is bounded by `max_bytes` (a client's largest body) in all; the body they make is
    held within the shadow copies' byte bound (`hold`: may the copy hold that much more)."""

    def __init__(self, upstream: Upstream, read_call: ReadCall, max_bytes: int, hold: Hold) -> None:
        self.upstream = upstream
        self.read_call = read_call
        self.max_bytes = max_bytes
        self.hold = hold
        self._unread = max_bytes  # what the reads may still bring

    async def stateless_body(self, body: bytes, previous: str) -> bytes:
        """`body` (a Responses request continuing `previous`) in the stateless form, with the
        history `previous` was answered from and its output as input."""
        data = orjson.loads(body)
        own = data.get("input")
        if isinstance(own, str):
            own = [{"type": "message", "role": "user", "content": own}]
        if not isinstance(own, list):
            raise ContextUnavailable("the request's input is neither text nor items")
        history = await self._input_items(previous)
        stored = await self._read(f"responses/{quote(previous, safe='')}")
        output = stored.get("output")
        if not isinstance(output, list):
            raise ContextUnavailable("the stored response has no output")
        data.pop("previous_response_id", None)
        data["input"] = [*_portable(history), *_portable(output), *own]
        try:
            stateless = orjson.dumps(data)
        except orjson.JSONEncodeError as exc:  # deeper than orjson writes
            raise ContextUnavailable(str(exc)) from None
        if len(stateless) > self.max_bytes:
            raise ContextUnavailable(f"the context is over {self.max_bytes} bytes")
        if not self.hold(len(stateless) - len(body)):
            raise ContextUnavailable("the shadow copies hold their byte bound already")
        return stateless

    async def _input_items(self, previous: str) -> list[Any]:
        """Every input item of the stored response, oldest first, page by page."""
        path = f"responses/{quote(previous, safe='')}/input_items?order=asc&limit={PAGE_ITEMS}"
        items: list[Any] = []
        after = ""
        for _ in range(MAX_PAGES):
            page = await self._read(path + (f"&after={quote(after, safe='')}" if after else ""))
            data = page.get("data")
            if not isinstance(data, list):
                raise ContextUnavailable("the input items are not a list")
            items += data
            after = str(page.get("last_id") or "")
            if not page.get("has_more"):
                return items
            if not after:
                raise ContextUnavailable("the input items say there are more, but not after what")
        raise ContextUnavailable(f"the context has over {MAX_PAGES * PAGE_ITEMS} items")

    async def _read(self, path: str) -> dict[str, Any]:
        """A GET of `path` on the chain's backend: its JSON object, or ContextUnavailable."""
        call = self.read_call(path)
        try:
            response = await open_response(self.upstream, call)
        except UpstreamFailure as failure:
            raise ContextUnavailable(f"GET /v1/{path.split('?')[0]}: {failure.kind}") from None
        try:
            raw = await _read_bounded(response, self._unread)
        finally:
            response.close()
        self._unread -= len(raw)
        if response.status != 200:
            raise ContextUnavailable(f"GET /v1/{path.split('?')[0]}: HTTP {response.status}")
        try:
            found = orjson.loads(raw)
        except orjson.JSONDecodeError:
            found = None
        if not isinstance(found, dict):
            raise ContextUnavailable(f"GET /v1/{path.split('?')[0]}: not a JSON object")
        return found


async def _read_bounded(response: Response, limit: int) -> bytes:
    """The whole answer, if it is no more than `limit` bytes."""
    if response.content_length is not None and response.content_length > limit:
        raise ContextUnavailable(f"an answer of {response.content_length} bytes")
    parts: list[bytes] = []
    held = 0
    try:
        while chunk := await response.readany():
            held += len(chunk)
            if held > limit:
                raise ContextUnavailable(f"an answer over {limit} bytes")
            parts.append(chunk)
    except (*TRANSPORT_ERRORS, TimeoutError) as exc:
        raise ContextUnavailable(f"the answer broke: {type(exc).__name__}") from None
    return b"".join(parts)


def _portable(items: list[Any]) -> list[Any]:
    """The items another model can be sent; ContextUnavailable if one cannot be."""
    kept = []
    for item in items:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind in PORTABLE_ITEMS:
            kept.append(item)
        elif kind not in LEFT_OUT_ITEMS:
            raise ContextUnavailable(f"an item of type {str(kind)[:40]!r} in the context")
    return kept
