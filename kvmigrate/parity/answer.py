"""The parts of one response that comparators read, whatever API and framing it came in.

A response arrives as recorded bytes (JSON, or an SSE stream that `recorder.assemble`
turns into the non-streamed structure) plus its HTTP status. `Outcome` says whether it is an
answer or an error; `Answer` is the one choice being compared, read alike from chat
completions, legacy completions, the Responses API and Anthropic's Messages API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from kvmigrate.wire.assemble import assemble, is_sse
from kvmigrate.wire.content import content_text
from kvmigrate.wire.sse import sse_events

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One side of a pair. status None: the call never got an HTTP answer (connection
    refused, timeout). `response` is the (assembled) JSON object, None when the body held
    none; `error` the error object when the answer is one (an error status, a body with a
    top-level error, or an error event inside a 200 stream)."""

    status: int | None
    response: JSON | None
    error: JSON | None = None
    streamed: bool = False

    @property
    def ok(self) -> bool:
        return (
            self.status is not None
            and self.status < 400
            and self.response is not None
            and self.error is None
        )

    @property
    def status_class(self) -> str:
        if self.status is None:
            return "no_answer"
        if self.error is not None and self.status < 400:
            return "stream_error"
        if self.response is None and self.status < 400:
            return "unreadable"
        return f"{self.status // 100}xx"


UNSET: Any = object()  # `assembled` not given


def read_outcome(route: str, body: bytes, status: int | None, assembled: Any = UNSET) -> Outcome:
    """An Outcome from recorded bytes, streamed or not. `assembled`: the stream already
    reassembled by the caller (`kvmigrate.wire.assemble.assemble`), not to do it twice."""
    if status is None:
        return Outcome(None, None)
    streamed = is_sse(body)
    if streamed:
        # An error event has an "error" member (or the value "error"); most streams have
        # none, and parsing every event one by one to find out cost more than the rest.
        error = None
        if b'"error"' in body:
            error = next((d for _e, d in sse_events(body) if _is_error(d)), None)
        response = assemble(route, body) if assembled is UNSET else assembled
        return Outcome(status, response, error, True)
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        data = None
    response = data if isinstance(data, dict) else None
    error = response if response is not None and (_is_error(response) or status >= 400) else None
    return Outcome(status, response, error)


def outcome_of(value: Outcome | Mapping[str, Any]) -> Outcome:
    """A plain response dict counts as a 200 answer (or an error, if it is an envelope)."""
    if isinstance(value, Outcome):
        return value
    data = dict(value)
    return Outcome(200, data, data if _is_error(data) else None)


def _is_error(data: Mapping[str, Any]) -> bool:
    # A Responses API answer always carries `"error": null`; only a value means an error.
    return data.get("error") is not None or data.get("object") == "error"


@dataclass(frozen=True, slots=True)
class ToolCallView:
    id: str | None
    name: str
    arguments: str
    free_text: bool = False  # a custom tool's `input`: text, not JSON arguments


@dataclass(frozen=True, slots=True)
class Answer:
    """The first choice of an answer. `text` is '' when there is none."""

    text: str
    refusal: str | None
    tool_calls: tuple[ToolCallView, ...]
    finish_reason: str | None
    choices: int = 1

    @property
    def is_tool_answer(self) -> bool:
        return bool(self.tool_calls)


def extract_answer(response: Mapping[str, Any]) -> Answer:
    if isinstance(response.get("output"), list) or response.get("object") == "response":
        return _responses_answer(response)
    if response.get("type") == "message" and isinstance(response.get("content"), list):
        return _messages_answer(response)
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else {}
    first = first if isinstance(first, dict) else {}
    count = len(choices) if isinstance(choices, list) else 0
    finish = first.get("finish_reason")
    finish = finish if isinstance(finish, str) else None
    message = first.get("message")
    if not isinstance(message, dict):
        text = first.get("text")
        return Answer(text if isinstance(text, str) else "", None, (), finish, count)
    content = content_text(message.get("content"))
    refusal = message.get("refusal")
    calls = tuple(
        _chat_tool_call(c) for c in message.get("tool_calls") or () if isinstance(c, dict)
    )
    legacy = message.get("function_call")
    if not calls and isinstance(legacy, dict):
        calls = (_function_call(None, legacy),)
    return Answer(
        content, refusal if isinstance(refusal, str) and refusal else None, calls, finish, count
    )


def _chat_tool_call(call: Mapping[str, Any]) -> ToolCallView:
    call_id = call.get("id")
    own_id = call_id if isinstance(call_id, str) else None
    custom = call.get("custom")
    if call.get("type") == "custom" and isinstance(custom, Mapping):
        # A custom tool's call carries free text as `input`: read as nothing, two different
        # calls of it were the same nameless, empty call.
        return _custom_call(own_id, custom)
    function = call.get("function")
    return _function_call(own_id, function if isinstance(function, Mapping) else {})


def _custom_call(call_id: str | None, custom: Mapping[str, Any]) -> ToolCallView:
    name, text = custom.get("name"), custom.get("input")
    return ToolCallView(
        call_id, name if isinstance(name, str) else "", text if isinstance(text, str) else "", True
    )


def _function_call(call_id: str | None, function: Mapping[str, Any]) -> ToolCallView:
    name = function.get("name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        # Some servers send arguments as an object; compare what it encodes.
        arguments = "" if arguments is None else orjson.dumps(arguments).decode()
    return ToolCallView(call_id, name if isinstance(name, str) else "", arguments)


def _responses_answer(response: Mapping[str, Any]) -> Answer:
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[ToolCallView] = []
    for item in response.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") in ("function_call", "custom_tool_call"):
            call_id = item.get("call_id")
            own_id = call_id if isinstance(call_id, str) else None
            custom = item.get("type") == "custom_tool_call"
            calls.append(_custom_call(own_id, item) if custom else _function_call(own_id, item))
        for part in item.get("content") or () if item.get("type") == "message" else ():
            if isinstance(part, dict) and part.get("type") == "refusal":
                refusals.append(str(part.get("refusal") or ""))
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return Answer(
        "".join(texts), "".join(refusals) or None, tuple(calls), _responses_finish(response, calls)
    )


def _responses_finish(response: Mapping[str, Any], calls: list[ToolCallView]) -> str | None:
    status = response.get("status")
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return reason if isinstance(reason, str) else "length"
    if status == "completed":
        return "tool_calls" if calls else "stop"
    return status if isinstance(status, str) else None


# Anthropic's stop_reason when the model declined (Claude 4's streaming classifiers).
REFUSAL_STOP = "refusal"


def _messages_answer(message: Mapping[str, Any]) -> Answer:
    """A Messages answer as the same Answer a chat answer gives: the text blocks joined,
    each `tool_use` block a call whose arguments are its `input` as JSON (so the tool
    comparator reads both APIs alike), `stop_reason` as the finish reason, and a
    `refusal` stop as a refusal. Thinking blocks are left out, as reasoning is for chat."""
    texts: list[str] = []
    calls: list[ToolCallView] = []
    for block in message.get("content") or ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in ("tool_use", "server_tool_use"):
            call_id = block.get("id")
            name = block.get("name")
            calls.append(
                ToolCallView(
                    call_id if isinstance(call_id, str) else None,
                    name if isinstance(name, str) else "",
                    orjson.dumps(block.get("input", {})).decode(),
                )
            )
    stop = message.get("stop_reason")
    stop = stop if isinstance(stop, str) else None
    text = "".join(texts)
    refusal = (text.strip() or "(stop_reason refusal)") if stop == REFUSAL_STOP else None
    return Answer(text, refusal, tuple(calls), stop)


def last_user_text(request: Mapping[str, Any]) -> str:
    """The text of the request's last user turn: what an answer should be about."""
    messages = request.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return content_text(message.get("content"))
        return ""
    for key in ("prompt", "input"):
        value = request.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            users = [v for v in value if isinstance(v, dict) and v.get("role", "user") == "user"]
            return content_text(users[-1].get("content")) if users else ""
    return ""
