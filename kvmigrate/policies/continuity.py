"""Conversation identity from continuity: an agent's next request resends the messages of its
previous request and the answer it got, so the digest of that history names the conversation
whatever the system prompt says now (`Current time: ...`, a retrieved-context block).

Each wire (chat `messages`, the Responses API's stateless `input` + `instructions`, Anthropic
Messages `system` + `messages`) has a small adapter that turns a request, or an answer, into
neutral messages: role, text, tool calls (name + arguments), tool reference. Everything else
here works on those, below the wire formats.

Normalised so that a client's re-serialisation of the answer still matches: string content and
text parts hash alike, `null` and empty content alike, tool-call ids and system messages are
left out, tool-call arguments compare as JSON (an agent may parse and re-dump them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from kvmigrate.wire.content import content_text, media_kind

# A request's newest user/tool messages are new in this turn; the history before them is what
# the previous request and its answer left.
NEW_ROLES = frozenset({"user", "tool"})
SYSTEM_ROLES = frozenset({"system", "developer"})
LINK_PREFIX = "c:"  # continuity links in the store's link map (issue 17 adds response ids)
# A request's own history, linked as soon as it arrives: the next turn, sent to another proxy
# before this one has linked the answer (a fast client), still finds its conversation.
REQUEST_PREFIX = "q:"

# Checks are `isinstance(x, (dict, Mapping))`: a parsed body's objects are dicts, which a C
# check answers, where Mapping alone is an ABC's check, a quarter of a message's encoding.
Encoded = tuple[str, bytes]  # (role, normalised bytes) of one non-system message
# A link is this many hex digits of its history's digest (16 bytes, as links have been).
LINK_DIGITS = 32


class RunningDigest(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def copy(self) -> RunningDigest: ...
    def hexdigest(self) -> str: ...


def running_digest() -> RunningDigest:
    """A history's digest, fed message by message. It names a history for routing and
    grouping, it authenticates nothing, and every turn hashes the whole history (100 KB and
    more for a long agent): SHA-1, which CPUs with SHA extensions (AMD since Zen, Intel
    since Ice Lake, Arm v8) hash at twice blake2b's speed and the others at about its speed.
    Finding two histories with one link would take a chosen-prefix collision built on a
    history the attacker cannot see, and would only misroute that attacker's own turn."""
    return hashlib.sha1(usedforsecurity=False)


def digest_text(digest: RunningDigest) -> str:
    return digest.hexdigest()[:LINK_DIGITS]


@dataclass(frozen=True, slots=True)
class History:
    """A request's non-system messages, normalised, and what identity needs from them."""

    lookup: str | None  # the answer link: the history before the newest user/tool messages
    asked: str | None  # the request link: the same history less the answer it ends with
    hasher: RunningDigest  # over every non-system message: the answer is added to it
    turn: int  # 1 + the answers this history resends
    # The next turn will find this request by its `request_link` (as its `asked`): the
    # history has messages and ends with one for the answer to follow (not an assistant
    # prefill, which the answer would continue).
    continued_by_request: bool = False

    @property
    def request_link(self) -> str:
        """What the next turn's `asked` will be, known before this request is answered."""
        return REQUEST_PREFIX + digest_text(self.hasher)


def history(messages: Sequence[Encoded]) -> History:
    """One pass over the encoded messages: the lookup digests and the running digest."""
    cut = len(messages)
    while cut and messages[cut - 1][0] in NEW_ROLES:
        cut -= 1
    start = cut  # where the answer this history ends with begins
    while start and messages[start - 1][0] == "assistant":
        start -= 1
    hasher = running_digest()
    lookup = asked = None
    answers = 0
    previous = ""
    for i, (role, data) in enumerate(messages):
        if i == start and start < cut:
            asked = REQUEST_PREFIX + digest_text(hasher)
        if i == cut:
            lookup = LINK_PREFIX + digest_text(hasher)
        if role == "assistant" and previous != "assistant":
            answers += 1  # consecutive assistant items (text + tool calls) are one answer
        previous = role
        hasher.update(data)
    if cut == len(messages) and cut:
        lookup = LINK_PREFIX + digest_text(hasher)  # ends with an answer: a continuation
    by_request = bool(messages) and messages[-1][0] != "assistant"
    if not answers:
        return History(None, None, hasher, 1, by_request)
    return History(lookup, asked if start else None, hasher, answers + 1, by_request)


def answer_digest(hasher: RunningDigest, answer: Sequence[Encoded]) -> str:
    """The link the next turn will look up: this request's history plus its answer."""
    extended = hasher.copy()
    for _role, data in answer:
        extended.update(data)
    return LINK_PREFIX + digest_text(extended)


def encode(role: str, text: str, calls: Sequence[tuple[str, Any]] = (), ref: str = "") -> Encoded:
    if not calls:  # most messages: one copy of the text, not three (join, append, encode)
        return role, f"{role}\x1f{text}\x1f{ref}\x1e".encode("utf-8", "surrogatepass")
    parts = [role, text, ref]
    for name, arguments in calls:
        parts += [name, canonical_arguments(arguments)]
    return role, ("\x1f".join(parts) + "\x1e").encode("utf-8", "surrogatepass")


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as compact sorted JSON when they parse, else as sent."""
    value = arguments
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return str(arguments)


def text_of(content: Any) -> str:
    """String content as is; a list of parts as its text parts joined, a media part as its
    kind; anything else empty."""
    return content_text(content, media_kind)


# -- chat completions ---------------------------------------------------------------------


def chat_message(message: Mapping[str, Any]) -> Encoded | None:
    role = message.get("role")
    if not isinstance(role, str) or role in SYSTEM_ROLES:
        return None
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, (dict, Mapping)) else None
        if isinstance(function, (dict, Mapping)):
            calls.append((str(function.get("name") or ""), function.get("arguments") or ""))
    ref = message.get("tool_call_id")
    return encode(role, text_of(message.get("content")), calls, ref if isinstance(ref, str) else "")


def chat_request(body: Mapping[str, Any]) -> list[Encoded] | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    return [e for m in messages if isinstance(m, (dict, Mapping)) and (e := chat_message(m))]


def chat_answer(response: Mapping[str, Any]) -> list[Encoded]:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return []
    message = choices[0].get("message")
    encoded = chat_message(message) if isinstance(message, (dict, Mapping)) else None
    return [encoded] if encoded else []


# -- Responses API, stateless mode ----------------------------------------------------------


def responses_item(item: Any) -> Encoded | None:
    if isinstance(item, str):
        return encode("user", item)
    if not isinstance(item, (dict, Mapping)):
        return None
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if not isinstance(role, str) or role in SYSTEM_ROLES:
            return None
        return encode(role, text_of(item.get("content")))
    if kind == "function_call":
        return encode("assistant", "", [(str(item.get("name") or ""), item.get("arguments"))])
    if kind == "function_call_output":
        output = item.get("output")
        return encode("tool", text_of(output), ref=str(item.get("call_id") or ""))
    return None  # reasoning and other items: a client may or may not resend them


def responses_request(body: Mapping[str, Any]) -> list[Encoded] | None:
    if body.get("previous_response_id") or body.get("conversation"):
        return None  # a stored chain: its identity is the chain's (issue 17), not ours
    items = body.get("input")
    if isinstance(items, str):
        return [encode("user", items)]
    if not isinstance(items, list):
        return None
    return [e for item in items if (e := responses_item(item))]


def responses_answer(response: Mapping[str, Any]) -> list[Encoded]:
    output = response.get("output")
    if not isinstance(output, list):
        return []
    return [e for item in output if (e := responses_item(item))]


# -- Anthropic Messages -------------------------------------------------------------------


def anthropic_message(message: Mapping[str, Any]) -> Encoded | None:
    role = message.get("role")
    if not isinstance(role, str):
        return None
    content = message.get("content")
    if isinstance(content, str):
        return encode(role, content)
    texts: list[str] = []
    calls: list[tuple[str, Any]] = []
    refs: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, (dict, Mapping)):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            calls.append((str(block.get("name") or ""), block.get("input") or {}))
        elif kind == "tool_result":
            refs.append(str(block.get("tool_use_id") or ""))
            texts.append(text_of(block.get("content")))
    # A user turn that only carries tool results is a tool message: new in this turn.
    role = "tool" if role == "user" and refs and not calls else role
    return encode(role, "".join(texts), calls, ",".join(refs))


def anthropic_request(body: Mapping[str, Any]) -> list[Encoded] | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    return [e for m in messages if isinstance(m, (dict, Mapping)) and (e := anthropic_message(m))]


def anthropic_answer(response: Mapping[str, Any]) -> list[Encoded]:
    encoded = anthropic_message({"role": "assistant", "content": response.get("content")})
    return [encoded] if encoded else []


@dataclass(frozen=True, slots=True)
class Wire:
    request: Callable[[Mapping[str, Any]], list[Encoded] | None]
    answer: Callable[[Mapping[str, Any]], list[Encoded]]


# By route below /v1. Anthropic's `messages` is ready for its ingress (issue 18).
WIRES: dict[str, Wire] = {
    "chat/completions": Wire(chat_request, chat_answer),
    "responses": Wire(responses_request, responses_answer),
    "messages": Wire(anthropic_request, anthropic_answer),
}


def request_history(route: str, body: Mapping[str, Any]) -> History | None:
    """The request's history on a route that has one; None on other routes or bodies."""
    wire = WIRES.get(route)
    messages = wire.request(body) if wire is not None else None
    return history(messages) if messages else None


def iter_answer(route: str, response: Mapping[str, Any]) -> Iterator[Encoded]:
    wire = WIRES.get(route)
    if wire is not None:
        yield from wire.answer(response)
