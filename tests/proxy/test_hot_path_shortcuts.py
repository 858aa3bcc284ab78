"""The finished-stream shortcuts (one parse for a shadow copy's check, the usage line found
from the end, the usage option spliced into a copy) answer as the full decoders do."""

from __future__ import annotations

import orjson
import pytest

from kvmigrate.exchange import _stream_usage
from kvmigrate.policies.outcome import ErrorKind
from kvmigrate.proxy.body import parse_body
from kvmigrate.proxy.copy_usage import with_usage
from kvmigrate.proxy.forward import Call
from kvmigrate.proxy.stream_check import SseCheck, _all_data_parses, malformed_kind

CHUNK = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
STREAMS = {
    "chat": CHUNK * 3 + USAGE + b"data: [DONE]\n\n",
    "crlf": (CHUNK * 2 + USAGE).replace(b"\n", b"\r\n"),
    "event lines": b"event: response.created\n" + CHUNK,
    "comment": b": keep-alive\n\n" + CHUNK,
    "two values on a line": b"data: 1,2\n\n",
    "values across the wrapping": b"data: 1],[2\n\n",
    "brackets": b"data: [1]],[[2]\n\n",
    "empty data": b"data: \n\n",
    "not json": CHUNK + b"data: {oops\n\n",
    "unknown field": b"bogus: 1\n\n",
    "cut off": CHUNK + b'data: {"choices":',
    "done variant": CHUNK + b"data:  [DONE] \n\n",
    "no blank line": CHUNK.strip() + b"\n" + USAGE.strip(),
}


def _exact(body: bytes) -> str | None:
    check = SseCheck()
    return None if check.feed(body) and check.end() else ErrorKind.MALFORMED_STREAM


@pytest.mark.parametrize("body", STREAMS.values(), ids=STREAMS.keys())
def test_the_one_parse_check_agrees_with_the_line_by_line_check(body: bytes) -> None:
    assert malformed_kind(body, event_stream=True) == _exact(body)
    if _all_data_parses(body):  # the shortcut never passes what the exact check refuses
        assert _exact(body) is None


def test_the_shortcut_refuses_a_line_that_is_not_one_value() -> None:
    for name in ("two values on a line", "values across the wrapping", "not json"):
        assert not _all_data_parses(STREAMS[name])
        assert malformed_kind(STREAMS[name], event_stream=True) == ErrorKind.MALFORMED_STREAM


USAGE_STREAMS = {
    "usage last": [CHUNK, CHUNK + USAGE + b"data: [DONE]\n\n"],
    "usage split across chunks": [CHUNK, USAGE[:30], USAGE[30:], b"data: [DONE]\n\n"],
    "the word in the text": [CHUNK, b'data: {"choices":[{"delta":{"content":"\\"usage\\""}}]}\n\n'],
    "usage then text naming it": [
        USAGE,
        b'data: {"choices":[{"delta":{"content":"\\"usage\\" is"}}]}\n\n',
    ],
    "responses": [
        b'event: response.completed\ndata: {"response":{"usage":{"input_tokens":7}}}\n\n'
    ],
    "multi-line data": [b'data: {"usage":\ndata: {"prompt_tokens":3}}\n\n'],
    "null usage": [b'data: {"choices":[],"usage":null}\n\n'],
    "none": [CHUNK],
}


def _decoded_usage(chunks: list[bytes]) -> object:
    """The usage of the last event with one, by decoding every event."""
    from kvmigrate.wire.sse import decode_all, json_objects

    found = None
    for event in decode_all(b"".join(chunks)):
        for data in json_objects(event.data):
            usage = data.get("usage") or (data.get("response") or {}).get("usage")
            if isinstance(usage, dict):
                found = usage
    return found


@pytest.mark.parametrize("chunks", USAGE_STREAMS.values(), ids=USAGE_STREAMS.keys())
def test_usage_found_from_the_end_is_the_last_events(chunks: list[bytes]) -> None:
    assert _stream_usage(chunks) == _decoded_usage(chunks)


def test_a_streamed_copy_asks_for_usage_without_re_encoding_the_body() -> None:
    raw = b'  {"model": "m", "stream": true, "messages": [{"role": "user", "content": "\\u00e9"}]}'
    body = parse_body(raw)
    copy = with_usage(Call("POST", "http://x/v1/chat/completions", raw, {}), body)
    assert orjson.loads(copy.body) == {**body.data, "stream_options": {"include_usage": True}}
    assert raw.strip()[1:] in copy.body  # the client's bytes, untouched
    # A client's own stream_options are kept, with the option added.
    raw = b'{"model": "m", "stream": true, "stream_options": {"x": 1}}'
    copy = with_usage(Call("POST", "u", raw, {}), parse_body(raw))
    assert orjson.loads(copy.body)["stream_options"] == {"x": 1, "include_usage": True}
