"""The request body: validated once, forwarded as bytes with only `model` changed.

Clients depend on fields we do not model, so the body is never re-serialised when it can be
avoided: the model's value is spliced into the original bytes. Only a body that spells the
key in an unusual way (escaped characters) falls back to a re-encode.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from kvmigrate import bytescan
from kvmigrate.proxy.errors import ProxyError, bad_request, shown

_MODEL_KEY = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.)*")')
# A body holding `model` twice is read one way here (the last wins) and maybe the other way
# upstream: it would pass the allowlist as one model and be served as another. Each scanned
# key costs about one more pass over the body, so only the keys the proxy decides on are:
# `model` always, and `previous_response_id` when the body has one (the proxy sends the
# request to the backend holding that response; a backend that kept the first would
# continue another chain). `stream` decides nothing here (the upstream's content type does).
_MODEL_SPELLING = b'"model"'
_PREVIOUS_SPELLING = b'"previous_response_id"'
# A printable ASCII letter written as `\u00XX`: no encoder needs that, but `"mod\u0065l"`
# is `model` to every parser while the byte scan above would not see it.
_ESCAPED_ASCII = re.compile(rb"\\u00[4-7][0-9a-fA-F]")
_ESCAPE = b"\\u00"
_ESCAPES_LOOKED_AT = 2


@dataclass(frozen=True, slots=True)
class RequestBody:
    raw: bytes
    data: dict[str, Any]
    model: str
    # Where `"model"` is spelled, when the body spells it once, escapes no letter and has a
    # top-level model: that is its key, and `with_model` splices there with no other scan.
    model_at: int = -1

    @property
    def stream(self) -> bool:
        return self.data.get("stream") is True


def parse_body(raw: bytes, require_model: bool = True) -> RequestBody:
    """Validate a JSON request body. Anything malformed is a 400 and is never forwarded."""
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object.")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    model_at = _refuse_duplicate_keys(raw, "previous_response_id" in data)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        if require_model:
            raise bad_request("You must provide a model parameter.", param="model")
        model, model_at = "", -1  # a `"model"` spelled once is not the top level's
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("`stream` must be a boolean.", param="stream")
    return RequestBody(raw, data, model, model_at)


def _refuse_duplicate_keys(raw: bytes, chained: bool) -> int:
    """A 400 for a body whose top level repeats a key. The cheap test first: `"model"`
    spelled once (its first and last occurrence coincide) cannot be duplicated, and that
    costs one memory-speed pass, not a second parse; for a `chained` body (one with a
    `previous_response_id`), that key spelled once too. Only a body where one occurs twice,
    anywhere (or one that escapes a letter), is parsed again, and then every top-level key
    is checked. Returns where the cheap test found `"model"` spelled once (else -1)."""
    once, first = bytescan.spelled_once(raw, _MODEL_SPELLING)
    if (
        once
        and not _escapes_a_letter(raw)
        and not (chained and not bytescan.spelled_once(raw, _PREVIOUS_SPELLING)[0])
    ):
        return first
    top: list[list[tuple[str, Any]]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        top[:] = [items]  # the top-level object is the last one to close
        return {}

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except RecursionError:
        # The stdlib parser recurses per level and hits Python's recursion limit below
        # orjson's depth limit (1024): a body orjson took can still be too deep to check.
        raise _too_deep() from None
    seen: set[str] = set()
    for key, _value in top[0] if top else []:
        if key in seen:
            raise bad_request(f"The request body repeats the key `{shown(key)}`.", param=shown(key))
        seen.add(key)
    return -1


def _escapes_a_letter(raw: bytes) -> bool:
    """Whether the body writes a letter as `\\u00XX`. The first few `\\u00` are found at
    memory speed and the letter checked where each is; most bodies have none or a few (a
    regular expression over a whole agent body costs far more: benchmarks/duplicate_key_scan.py
    measures it). Past `_ESCAPES_LOOKED_AT` of
    them (a tool's coloured output holds many `\\u001b`), the expression takes the rest,
    as a loop over each would cost more."""
    at = bytescan.find(raw, _ESCAPE)
    for _ in range(_ESCAPES_LOOKED_AT):
        if at < 0:
            return False
        if _ESCAPED_ASCII.match(raw, at):
            return True
        at = bytescan.find(raw, _ESCAPE, at + 1)
    return at >= 0 and _ESCAPED_ASCII.search(raw, at) is not None


def _too_deep() -> ProxyError:
    return bad_request(
        "The request body nests arrays or objects too deeply to be checked or rewritten; "
        "keep it below 250 levels."
    )


def check_passthrough_body(content_type: str, raw: bytes) -> None:
    """Other /v1 routes take JSON or multipart uploads (files, audio), as OpenAI's API does;
    a body that is neither, or JSON that does not parse, is refused rather than forwarded."""
    if not raw:
        return
    if content_type == "application/json":
        try:
            orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"The request body is not valid JSON: {exc}") from None
    elif content_type != "multipart/form-data":
        raise ProxyError(
            415,
            "Send the request body as application/json or multipart/form-data.",
            "invalid_request_error",
            "unsupported_media_type",
        )


def with_model(body: RequestBody, served_model: str) -> bytes:
    """The original bytes with the top-level `model` set to `served_model`."""
    if served_model == body.model:
        return body.raw
    replacement = orjson.dumps(served_model)
    if body.model_at >= 0 and (match := _MODEL_KEY.match(body.raw, body.model_at)):
        return _splice(body.raw, match, replacement)
    matches = list(_MODEL_KEY.finditer(body.raw))
    if len(matches) == 1 and body.model and b"\\u" not in body.raw:
        # One `"model": "..."` pair in the whole body, no key spelled with escapes, and the
        # parsed top level has a string model: this pair is the top-level one.
        return _splice(body.raw, matches[0], replacement)
    for match in matches:
        candidate = _splice(body.raw, match, replacement)
        if orjson.loads(candidate).get("model") == served_model:
            return candidate
    try:
        return orjson.dumps({**body.data, "model": served_model})
    except orjson.JSONEncodeError:
        # orjson writes at most 255 levels though it reads 1024: a body whose key could not
        # be spliced (spelled with escapes) and that nests deeper cannot be re-encoded.
        raise _too_deep() from None


def _splice(raw: bytes, match: re.Match[bytes], replacement: bytes) -> bytes:
    # One copy of the body: slicing and adding bytes made two (benchmarks/agent_body.py
    # measures what a large body costs a request).
    view = memoryview(raw)
    return b"".join((view[: match.start(1)], replacement, view[match.end(1) :]))


_PREVIOUS_KEY = re.compile(rb'"previous_response_id"\s*:\s*("(?:[^"\\]|\\.)*")')


def with_previous_response(raw: bytes, response_id: str) -> bytes:
    """A Responses request's bytes naming `response_id` as the response it continues: a
    shadow copy continues the candidate's own chain. Spliced, as `with_model` is;
    only a body where the key also occurs nested is checked by parsing, or re-encoded."""
    replacement = orjson.dumps(response_id)
    matches = list(_PREVIOUS_KEY.finditer(raw))
    if len(matches) == 1 and b"\\u" not in raw:
        return _splice(raw, matches[0], replacement)
    for match in matches:
        candidate = _splice(raw, match, replacement)
        if orjson.loads(candidate).get("previous_response_id") == response_id:
            return candidate
    return orjson.dumps({**orjson.loads(raw), "previous_response_id": response_id})
