"""`POST /v1/feedback`: a client scores a conversation or an answer.

Let in exactly as a request the candidate serves: with `server.master_key`, the proxy checks
the key; in pass-through, the primary must vouch for the client's key first (a key it
refuses gets its refusal, as it came); open, anyone who reaches the proxy. Only then is the
body read, up to its own small limit. A score naming an id no record holds is stored all
the same (202): the answer it scores may still be on its way to the database, and the report
counts the scores it could not join.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import msgspec
import orjson
from aiohttp import web

from kvmigrate.feedback.request import (
    MAX_BODY_BYTES,
    Feedback,
    FeedbackError,
    FeedbackUnavailable,
    parse_feedback,
)
from kvmigrate.proxy.errors import JSON_CONTENT_TYPE, ProxyError, bad_request
from kvmigrate.proxy.intake import authorize, read_body

if TYPE_CHECKING:
    from kvmigrate.proxy.service import ProxyService

PATH = "/v1/feedback"


class Sink(Protocol):
    """What the route needs of `recorder.feedback_sink.FeedbackSink`."""

    async def write_async(self, feedback: Feedback) -> str: ...
    def close(self) -> None: ...


def find_sink(addons: Sequence[object]) -> Sink | None:
    """The recorder's feedback sink, when an addon records (`RecorderAddon.feedback_sink`)."""
    for addon in addons:
        make = getattr(addon, "feedback_sink", None)
        if callable(make):
            sink: Sink = make()
            return sink
    return None


async def handle_feedback(
    service: ProxyService, sink: Sink | None, request: web.Request
) -> web.StreamResponse:
    authorize(request, service.config.server.master_key)
    key = service.keys.key_of(request)
    primary = service.rollout.current().primary
    refused = await service.keys.check(request, key, service.upstreams[primary])
    if refused is not None:
        return await refused.answer(request, [])
    server = msgspec.structs.replace(service.config.server, max_body_bytes=MAX_BODY_BYTES)
    feedback = read_feedback(await read_body(request, server))
    if sink is None:
        raise ProxyError(
            404,
            "This proxy records nothing (record.enabled is false), so it keeps no feedback.",
            "invalid_request_error",
            "feedback_not_recorded",
        )
    try:
        ident = await sink.write_async(_as_recorded(service, feedback))
    except FeedbackUnavailable:
        # Why is in the proxy's log (recorder.feedback_sink), not in an answer to a client.
        raise ProxyError(
            503,
            "The records database cannot take feedback now; try again shortly.",
            "server_error",
            "feedback_unavailable",
        ) from None
    body = {"id": ident, "object": "feedback", "name": feedback.name, "value": feedback.value}
    return web.Response(status=202, body=orjson.dumps(body), content_type=JSON_CONTENT_TYPE)


def _as_recorded(service: ProxyService, feedback: Feedback) -> Feedback:
    """The conversation id as records group its turns: through the rollout store's keyed
    hash when there is one (`Exchange.grouping_key`), so the sink's hash matches theirs."""
    declared = feedback.conversation_id
    if declared is None:
        return feedback
    return replace(feedback, conversation_id=service.identity.in_store(declared) or declared)


def read_feedback(raw: bytes) -> Feedback:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        data = _lenient(raw, exc)
    try:
        return parse_feedback(data)
    except FeedbackError as exc:
        raise bad_request(str(exc), exc.param) from None


def _lenient(raw: bytes, error: orjson.JSONDecodeError) -> object:
    """What Python's parser makes of a body orjson refused: `NaN`, `Infinity` and `1e999`
    are scores a client may well send, and deserve "not finite" rather than "not JSON"
    (the body is small: a second parse costs nothing)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_request(f"The request body is not valid JSON: {error}") from None
