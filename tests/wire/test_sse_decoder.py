"""The one SSE decoder (kvmigrate.wire.sse): the event-stream rules, and the same events
whatever the cuts between the chunks that carry a stream."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvmigrate.proxy.exchange import Exchange
from kvmigrate.proxy.stream_check import MAX_LINE_BYTES, SseCheck, framing_error, malformed_kind
from kvmigrate.wire.sse import LineDecoder, ServerSentEvent, SSEDecoder, decode_all, sse_events

E = ServerSentEvent

CASES = [
    pytest.param(b"data: {}\n\n", [E(data=b"{}")], id="one event"),
    pytest.param(b"data: a\r\n\r\ndata: b\r\r", [E(data=b"a"), E(data=b"b")], id="crlf and cr"),
    pytest.param(b"data:a\n\n", [E(data=b"a")], id="no space"),
    pytest.param(b"data:  a\n\n", [E(data=b" a")], id="only one space dropped"),
    pytest.param(b"data: a\ndata: b\n\n", [E(data=b"a\nb")], id="multi-line data"),
    pytest.param(b"data\n\n", [E(data=b"")], id="a field without a colon"),
    pytest.param(b": keep-alive\n\ndata: x\n\n", [E(data=b"x")], id="comment"),
    pytest.param(b"event: done\n\n", [], id="no data, no event"),
    pytest.param(
        b"event: ping\ndata: 1\n\ndata: 2\n\n",
        [E("ping", b"1"), E(data=b"2")],
        id="event name lasts one event",
    ),
    pytest.param(
        b"id: 7\ndata: 1\n\ndata: 2\n\nid: a\x00b\ndata: 3\n\n",
        [E(data=b"1", id="7"), E(data=b"2", id="7"), E(data=b"3", id="7")],
        id="id carries over; one with NUL is ignored",
    ),
    pytest.param(
        b"retry: 3000\ndata: 1\n\nretry: x\ndata: 2\n\n",
        [E(data=b"1", retry=3000), E(data=b"2")],
        id="retry",
    ),
    pytest.param(b"foo: bar\ndata: 1\n\n", [E(data=b"1")], id="unknown field ignored"),
    pytest.param(
        "event: é\ndata: ü\n\n".encode(), [E("é", "ü".encode())], id="utf-8 name and data"
    ),
    pytest.param(b"data: cut off", [E(data=b"cut off")], id="a stream that broke off"),
    pytest.param(b"data: 1\n", [E(data=b"1")], id="an event never closed"),
]


@pytest.mark.parametrize(("body", "events"), CASES)
def test_decoder_follows_the_event_stream_rules(body: bytes, events: list[E]) -> None:
    assert decode_all(body) == events
    decoder = SSEDecoder()
    assert [*decoder.feed(body), *decoder.flush()] == events


def test_only_a_blank_line_dispatches() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: 1\n") == []
    assert decoder.feed(b"\n") == [E(data=b"1")]
    assert decoder.flush() == []


def test_a_crlf_cut_between_two_chunks_is_one_line_end() -> None:
    lines = LineDecoder()
    assert lines.feed(b"data: a\r") == [b"data: a"]
    assert lines.feed(b"\n") == []  # the pair of the `\r`, not a blank line
    assert lines.feed(b"\ndata: b") == [b""]
    assert lines.flush() == [b"data: b"]


# Streams built from the pieces that matter: line ends of each kind, comments, fields with
# and without a space, multi-line data, multi-byte UTF-8 and JSON.
_LINE = st.sampled_from(
    [
        b'data: {"choices":[{"delta":{"content":"h\xc3\xa9"}}]}',
        b"data:[DONE]",
        b"data: \xe2\x82\xac",
        b": comment",
        b"event: response.output_text.delta",
        b"id: 42",
        b"retry: 100",
        b"",
        b"data",
    ]
)
_END = st.sampled_from([b"\n", b"\r\n", b"\r"])
_STREAM = st.lists(st.tuples(_LINE, _END), max_size=30).map(
    lambda pairs: b"".join(line + end for line, end in pairs)
)


def _cut(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


@given(_STREAM, st.lists(st.integers(min_value=0), max_size=40))
def test_any_cut_gives_the_same_events(body: bytes, cuts: list[int]) -> None:
    decoder = SSEDecoder()
    events = [event for piece in _cut(body, cuts) for event in decoder.feed(piece)]
    assert [*events, *decoder.flush()] == decode_all(body)


@given(_STREAM, st.lists(st.integers(min_value=0), max_size=40))
def test_any_cut_gives_the_same_lines(body: bytes, cuts: list[int]) -> None:
    lines = LineDecoder()
    got = [line for piece in _cut(body, cuts) for line in lines.feed(piece)]
    assert [*got, *lines.flush()] == body.splitlines()


@given(_STREAM, st.lists(st.integers(min_value=0), max_size=40))
def test_the_stream_check_does_not_depend_on_the_cuts(body: bytes, cuts: list[int]) -> None:
    check = SseCheck()
    verdicts = [check.feed(piece) for piece in _cut(body, cuts)]
    whole = malformed_kind(body, event_stream=True)
    assert (all(verdicts) and check.end()) == (whole is None)


def test_the_stream_check_judges_each_line_before_its_event_ends() -> None:
    check = SseCheck()
    assert check.feed(b'data: {"a": 1}\n\n: ok\nevent: x\nid: 1\nretry: 5\ndata: [DONE]\n')
    assert not check.feed(b"data: {not json\n")  # caught though its blank line is to come
    assert not SseCheck().feed(b"nonsense\n")
    assert malformed_kind(b"data: {}\r\rdata: {}\r\r", event_stream=True) is None
    assert malformed_kind(b'data: {"a": ', event_stream=True) == "malformed_stream"


@pytest.mark.parametrize(
    ("first", "verdict"),
    [
        (b"x" * 65536, False),  # no line end: only its start can tell
        (b"datum", False),
        (b"<html>", False),
        (b"da", True),  # the start of `data`
        (b"data: {", True),  # the rest of the line is on its way
        (b"event", True),
        (b": a comment", True),
        (b"retry:", True),
    ],
)
def test_the_stream_check_judges_a_line_by_its_start_before_its_end(
    first: bytes, verdict: bool
) -> None:
    assert SseCheck().feed(first) is verdict


def test_a_line_longer_than_any_event_fails_the_check() -> None:
    check = SseCheck()
    assert check.feed(b"data: ")
    chunk = b"1" * (1024 * 1024)
    verdicts = [check.feed(chunk) for _ in range(MAX_LINE_BYTES // len(chunk))]
    assert all(verdicts[:-1])
    assert not verdicts[-1]


@pytest.mark.parametrize(
    ("status", "asked_to_stream", "event_stream", "error"),
    [
        (200, True, True, None),
        (200, False, False, None),
        (200, True, False, "malformed_stream"),  # JSON where a stream was asked for
        (200, False, True, "malformed_body"),
        (302, False, False, "unexpected_status"),
        (301, True, False, "unexpected_status"),
        (204, False, False, "unexpected_status"),
        (101, False, False, "unexpected_status"),
        (400, True, False, None),  # an error answered in JSON is judged as an error
        (503, False, False, None),
        (None, True, False, None),
    ],
)
def test_a_candidate_answer_s_framing(
    status: int | None, asked_to_stream: bool, event_stream: bool, error: str | None
) -> None:
    assert framing_error(status, asked_to_stream, event_stream) == error


def test_events_of_a_body_skip_done_and_read_single_newline_framing() -> None:
    body = b'event: e\ndata: {"a": 1}\n\ndata: {"b": 2}\ndata: {"c": 3}\n\ndata: [DONE]\n\n'
    assert list(sse_events(body)) == [("e", {"a": 1}), ("message", {"b": 2}), ("message", {"c": 3})]


def _usage_of_stream(chunks: list[bytes]) -> object:
    x = Exchange("r", "chat/completions", "vllm", "serve", "m", "m", "c", 1, True, 0.0)
    x.chunks = chunks
    return x.usage


@given(st.lists(st.integers(min_value=0), max_size=12), st.sampled_from([b"\n", b"\r\n"]))
def test_usage_of_a_stream_whatever_its_cuts(cuts: list[int], end: bytes) -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 2}
    events = [{"choices": [{"delta": {"content": "x"}}]}] * 12 + [{"choices": [], "usage": usage}]
    body = b"".join(b"data: " + orjson.dumps(e) + end + end for e in events)
    body += b"data: [DONE]" + end + end
    assert _usage_of_stream(_cut(body, cuts)) == usage
