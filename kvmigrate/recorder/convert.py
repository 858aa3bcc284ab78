"""Turn a finished Exchange into a Record: all the parsing, done on the writer thread."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from kvmigrate.exchange import Exchange, Role
from kvmigrate.parity.answer import UNSET
from kvmigrate.parity.recording import CANDIDATE_KIND, NOISE_KIND, ParityFields, parity_fields
from kvmigrate.policies.conversation import is_derived_key
from kvmigrate.recorder.history import HistoryMemo
from kvmigrate.recorder.record import Record
from kvmigrate.redaction import Redactor
from kvmigrate.wire.assemble import assemble, is_sse
from kvmigrate.wire.sse import sse_payloads
from kvmigrate.wire.usage import token_counts

CONTENT_POLICIES = ("none", "redacted", "full")
HASH_KEY_BYTES = 32
# Answers kept until their shadow copies finish; beyond this the oldest go unscored.
MAX_ORIGINALS = 2_000
# Routes whose answers hold text worth keeping; an embeddings answer is a vector blob.
TEXT_ROUTES = frozenset({"chat/completions", "completions", "responses", "messages"})


class RecordConverter:
    """`to_record` for a stream of (exchange, wall-clock start) items, in the order the
    proxy finished them, pairing each shadow copy or noise call with the answer it copies.

    Stateful (the redactor's memo, the answers awaiting their copies), so one converter
    serves one writer; it is where pairing happens so that the proxy's event loop keeps
    nothing for it."""

    def __init__(
        self,
        content: str,
        source: str,
        redactor: Redactor | None = None,
        hash_key: bytes | None = None,
    ) -> None:
        if content not in CONTENT_POLICIES:
            raise ValueError(f"content must be one of {CONTENT_POLICIES}, got {content!r}")
        self.content = content
        self.source = source
        self.hash_key = new_hash_key() if hash_key is None else hash_key
        self._redactor = redactor or Redactor()
        self.history = HistoryMemo()
        # Answers awaiting their copies, with the answer reassembled once for all scorings.
        self._originals: OrderedDict[str, tuple[Exchange, Any]] = OrderedDict()

    def __call__(self, item: tuple[Exchange, float]) -> Record:
        exchange, ts = item
        shadowed, answer, original_answer = None, UNSET, UNSET
        if exchange.has_shadow_copy:
            # Its shadow copy (and maybe a noise call) will follow: keep it to score them.
            answer = _answer(exchange.route, b"".join(exchange.chunks), metrics_only=False)
            self._originals[exchange.request_id] = (exchange, answer)
            if len(self._originals) > MAX_ORIGINALS:
                self._originals.popitem(last=False)
        elif exchange.pair_id is not None:
            shadowed, original_answer = self._originals.get(exchange.pair_id, (None, UNSET))
        return to_record(
            exchange,
            ts,
            self.content,
            self.source,
            self._redactor,
            shadowed,
            self.history,
            answer=answer,
            original_answer=original_answer,
            hash_key=self.hash_key,
        )


def new_hash_key() -> bytes:
    """A key no one else knows: ids hashed with it match only ids hashed with it."""
    return secrets.token_bytes(HASH_KEY_BYTES)


def stored_conversation(conversation: str, content: str, key: bytes) -> str:
    """The conversation id as records keep it. An id from `user` or `X-Session-ID` is often
    personal data (an email, a user id): unless `content: full` it is stored as a keyed
    hash, stable across turns, so reports still group a conversation without naming anyone.
    Ids the proxy derived itself (`h:` + a digest of the prompt prefix) are already hashes."""
    if content == "full" or not conversation or is_derived_key(conversation):
        return conversation
    digest = hmac.new(key, conversation.encode("utf-8", "surrogateescape"), hashlib.blake2b)
    return "k:" + digest.hexdigest()[:24]


def to_record(
    exchange: Exchange,
    ts: float,
    content: str,
    source: str,
    redactor: Redactor | None = None,
    shadowed: Exchange | None = None,
    history: HistoryMemo | None = None,
    answer: Any = UNSET,
    original_answer: Any = UNSET,
    hash_key: bytes | None = None,
) -> Record:
    """`ts` is the wall-clock time the call started (the Exchange keeps monotonic times).
    Pass one `redactor` and one `history` per writer to reuse their memos across records.
    `shadowed` is the primary answer a shadow copy or noise call shadows: the pair is
    scored for parity. `answer` and `original_answer`: those answers already reassembled
    (`kvmigrate.wire.assemble.assemble`), when the caller has them. `hash_key`: what a
    conversation id is hashed with (None: a fresh key, matching no other record's)."""
    redactor = redactor or Redactor()
    x = exchange
    if answer is UNSET:
        # A pair to score needs the whole answer: it is reassembled once, for both uses.
        whole = content != "none" or shadowed is not None
        answer = _answer(x.route, b"".join(x.chunks), metrics_only=not whole)
    response: dict[str, Any] | None = answer
    usage = _usage(response)
    tokens = token_counts(usage)
    error = x.error
    if error is None and x.status is not None and x.status >= 400:
        error = f"http_{x.status}"
    stored: dict[str, Any] = {}
    if content != "none":
        stored = _stored_request(x, ts, content, redactor, history or HistoryMemo())
        if x.route in TEXT_ROUTES:
            stored["response_json"] = _dump(response, content, redactor)
    names = tool_call_names(response)
    return Record(
        request_id=x.request_id,
        ts=ts,
        route=x.route,
        backend=x.backend,
        role=str(x.role),  # a plain str, as every store binds it
        model=x.model,
        served_model=x.served_model,
        conversation=x.conversation
        if content == "full"
        else stored_conversation(x.grouping_key, content, hash_key or new_hash_key()),
        turn=x.turn,
        stream=x.stream,
        status=x.status,
        error=error,
        ttft_ms=None if (ttft := x.ttft) is None else ttft * 1000,
        latency_ms=None if x.finished is None else (x.finished - x.started) * 1000,
        prompt_tokens=tokens.get("prompt"),
        cached_tokens=tokens.get("cached"),
        cache_write_tokens=tokens.get("cache_write"),
        completion_tokens=tokens.get("completion"),
        finish_reason=finish_reason(response),
        tool_calls=orjson.dumps(names).decode() if names else None,
        fallback_from=x.fallback_from,
        pair_id=x.pair_id,
        source=source,
        content=content,
        identity=x.identity or None,
        cohort=x.cohort or None,
        response_id=_response_id(x, response, content, hash_key),
        **_decode(x),
        **stored,
        **_parity(x, shadowed, response, original_answer),
    )


def _response_id(
    x: Exchange, response: dict[str, Any] | None, content: str, key: bytes | None
) -> str | None:
    """The id of the answer the client got, hashed as a conversation id is: feedback names
    an answer by it. A copy's or a noise call's own id no client ever saw."""
    value = response.get("id") if x.role == Role.SERVE and response is not None else None
    if not isinstance(value, str) or not value:
        return None
    return stored_conversation(value, content, key or new_hash_key())


def _decode(x: Exchange) -> dict[str, Any]:
    """A streamed answer's decode timing, in the record's units; {} for any other."""
    decode = x.decode_time
    if decode is None:
        return {}
    return {
        "decode_ms": decode * 1000,
        "decode_chunks": x.later_chunks,
        "chunk_gap_max_ms": x.max_chunk_gap * 1000,
    }


def _stored_request(
    x: Exchange, ts: float, content: str, redactor: Redactor, history: HistoryMemo
) -> dict[str, Any]:
    """The Record fields that hold the request: its body less its history, and the history
    as message digests plus the rows of messages not stored before."""

    def encode(value: Any) -> bytes:
        return _encode(value, content, redactor)

    try:
        split = history.split(x.route, x.request_body, ts, encode, x.grouping_key)
    except RecursionError:
        # msgspec, which splits off the history, recurses in Python and stops short of the
        # 1,024 levels orjson (and so the proxy) accepts: the request is then stored whole,
        # its history inline rather than as digests, which every reader of records accepts.
        return _whole_request(x.request_body, encode)
    if split is None:
        return {}
    return {
        "request_json": split.rest.decode(),
        "request_messages": split.refs,
        "messages": tuple(split.new),
        "touched": tuple(split.touched),
    }


def _whole_request(body: bytes, encode: Callable[[Any], bytes]) -> dict[str, Any]:
    try:
        return {"request_json": encode(orjson.loads(body)).decode()}
    except orjson.JSONDecodeError:
        return {}


def _answer(route: str, body: bytes, metrics_only: bool) -> dict[str, Any] | None:
    """The answer as one object. For `metrics_only`, a streamed chat answer without tool
    calls is read from its last events alone: usage and finish reason are all a metrics-
    only record needs, and reassembling every chunk was most of its cost."""
    if route not in TEXT_ROUTES and route != "messages":  # Messages: usage is in its events
        return _json_object(body)
    tail_will_do = metrics_only and route == "chat/completions" and is_sse(body)
    if tail_will_do and not any(marker in body for marker in _NEEDS_ALL_CHUNKS):
        summary = _stream_tail(body)
        if summary is not None:
            return summary
    return assemble(route, body)


# A tool call's name may be in any chunk; a second choice interleaves with the first.
_NEEDS_ALL_CHUNKS = (b'"tool_calls"', b'"index":1', b'"index": 1')
_TAIL_BYTES = 4096


def _stream_tail(body: bytes) -> dict[str, Any] | None:
    tail = body[-_TAIL_BYTES:]
    if len(body) > _TAIL_BYTES:
        tail = tail[tail.find(b"\n") + 1 :]  # from the first whole line
    try:
        events = [orjson.loads(p) for p in sse_payloads(tail)[-4:]]
    except orjson.JSONDecodeError:
        return None
    usage = reason = ident = None
    for event in events:
        if not isinstance(event, dict):
            return None
        usage = event.get("usage") or usage
        ident = event.get("id") or ident
        for part in event.get("choices") or ():
            if isinstance(part, dict) and part.get("finish_reason"):
                reason = part["finish_reason"]
    if reason is None:
        # The event that finished the answer is not in the tail: it is longer than the
        # tail (a final chunk with logprobs), or the stream broke. Read every chunk.
        return None
    choice = {"index": 0, "message": {"role": "assistant", "content": None}}
    return {"id": ident, "choices": [choice | {"finish_reason": reason}], "usage": usage}


def _parity(
    exchange: Exchange,
    shadowed: Exchange | None,
    assembled: dict[str, Any] | None,
    original_assembled: Any,
) -> dict[str, Any]:
    if shadowed is None or exchange.route not in TEXT_ROUTES:
        return {}
    kind = NOISE_KIND if exchange.role == Role.NOISE else CANDIDATE_KIND
    try:
        scored = parity_fields(kind, shadowed, exchange, assembled, original_assembled)
    except (orjson.JSONEncodeError, RecursionError):
        # An answer nested past what the comparators encode (orjson writes 255 levels, the
        # stdlib parser stops at Python's recursion limit): the pair is kept as a pair that
        # could not be scored, as one with an error answer is, rather than dropped whole.
        scored = ParityFields(kind, None, "[]", "[]", None, None)
    return {
        "parity_kind": scored.kind,
        "parity_score": scored.score,
        "parity_applicable": scored.applicable,
        "parity_disagree": scored.disagree,
        "parity_tool_agree": scored.tool_agree,
        "parity_json_valid": scored.json_valid,
    }


def _json_object(body: bytes) -> dict[str, Any] | None:
    if not body:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _dump(value: dict[str, Any] | None, content: str, redactor: Redactor) -> str | None:
    return None if value is None else _encode(value, content, redactor).decode()


def _encode(value: Any, content: str, redactor: Redactor) -> bytes:
    """JSON as stored under the content policy (`redacted` or `full`)."""
    try:
        return orjson.dumps(redactor(value) if content == "redacted" else value)
    except (orjson.JSONEncodeError, RecursionError):
        # orjson reads 1,024 levels but writes 255: a body the proxy served must still be
        # recorded (else a client could keep its traffic out of every report and gate), so
        # its deepest parts are stored as a marker.
        value = _cut_below(value, RECORDED_DEPTH)
        return orjson.dumps(redactor(value) if content == "redacted" else value)


RECORDED_DEPTH = 128
TOO_DEEP = "[kvmigrate: nested too deeply to record]"


def _cut_below(value: Any, depth: int) -> Any:
    """`value` with every object or list `depth` levels down replaced by TOO_DEEP."""
    if not isinstance(value, dict | list):
        return value
    if depth <= 0:
        return TOO_DEEP
    if isinstance(value, dict):
        return {key: _cut_below(item, depth - 1) for key, item in value.items()}
    return [_cut_below(item, depth - 1) for item in value]


def _usage(response: dict[str, Any] | None) -> dict[str, Any]:
    if response is None:
        return {}
    usage = response.get("usage")
    if usage is None and isinstance(response.get("response"), dict):
        usage = response["response"].get("usage")
    return usage if isinstance(usage, dict) else {}


def finish_reason(response: dict[str, Any] | None) -> str | None:
    if response is None:
        return None
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    if response.get("object") == "response":
        details = response.get("incomplete_details")
        if isinstance(details, dict) and isinstance(details.get("reason"), str):
            return str(details["reason"])
        status = response.get("status")
        return status if isinstance(status, str) else None
    if response.get("type") == "message":
        reason = response.get("stop_reason")  # Anthropic's, kept in its own words
        return reason if isinstance(reason, str) else None
    return None


def tool_call_names(response: dict[str, Any] | None) -> list[str]:
    """The names of the tools an answer calls, in order (chat choices, Responses output, or
    a Message's `tool_use` blocks)."""
    if response is None:
        return []
    names: list[str] = []
    for choice in response.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        for call in (message or {}).get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                names.append(function["name"])
    for item in response.get("output") or ():
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in ("function_call", "custom_tool_call") and isinstance(item.get("name"), str):
            names.append(item["name"])
    if response.get("type") == "message":
        for block in response.get("content") or ():
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "tool_use" and isinstance(block.get("name"), str):
                names.append(block["name"])
    return names
