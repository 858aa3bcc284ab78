"""What a record holds for an exchange, field by field: the conversation and answer ids as
stored, the error a status makes, the timings, the tokens and finish reason read off each
answer shape, and the tool names an answer calls."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from kvmigrate.exchange import Exchange, Role
from kvmigrate.recorder.convert import (
    RecordConverter,
    _answer,
    _stream_tail,
    finish_reason,
    new_hash_key,
    stored_conversation,
    to_record,
    tool_call_names,
)

KEY = b"\x01" * 32
DERIVED = "h:" + "0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("conversation", "content", "key", "stored"),
    [
        # golden: records written by earlier releases must keep matching
        ("alice@example.com", "redacted", KEY, "k:d822268defd11b1a51306672"),
        ("alice@example.com", "none", KEY, "k:d822268defd11b1a51306672"),
        ("alice@example.com", "redacted", b"\x02" * 32, "k:cd4da6e58c733f608f3b9f0f"),
        ("resp_123", "redacted", KEY, "k:760b6cd87d768d6147f7c826"),
        # bytes that were not UTF-8 hash as those bytes
        ("\udcff", "redacted", KEY, "k:e8a9c9d3f2fe83cf5a6d427e"),
        ("alice@example.com", "full", KEY, "alice@example.com"),
        ("", "redacted", KEY, ""),
        (DERIVED, "redacted", KEY, DERIVED),
        # near misses of a derived key are hashed like any declared id
        ("h:" + "0123456789abcdef0123456", "redacted", KEY, None),
        ("H:" + "0123456789abcdef01234567", "redacted", KEY, None),
    ],
)
def test_stored_conversation(
    conversation: str, content: str, key: bytes, stored: str | None
) -> None:
    got = stored_conversation(conversation, content, key)
    if stored is None:
        assert got.startswith("k:")
        assert len(got) == 26
        assert got != conversation
    else:
        assert got == stored


def test_a_new_hash_key_is_32_fresh_bytes() -> None:
    a, b = new_hash_key(), new_hash_key()
    assert len(a) == 32
    assert a != b


def chat_answer(**extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    } | extra


def exchange(answer: Any = None, body: bytes | None = None, **fields: Any) -> Exchange:
    x = Exchange(
        request_id=fields.pop("request_id", "req-1"),
        route=fields.pop("route", "chat/completions"),
        backend=fields.pop("backend", "openai"),
        role=fields.pop("role", Role.SERVE),
        model="gpt-4o",
        served_model="gpt-4o-2024",
        conversation=fields.pop("conversation", "alice@example.com"),
        turn=2,
        stream=fields.pop("stream", False),
        started=100.0,
        request_body=b'{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}]}',
        status=fields.pop("status", 200),
        finished=fields.pop("finished", 101.5),
        **fields,
    )
    x.chunks.append(orjson.dumps(answer) if body is None else body)
    return x


@pytest.mark.parametrize(
    ("status", "error", "recorded"),
    [
        (200, None, None),
        (399, None, None),
        (400, None, "http_400"),
        (503, None, "http_503"),
        (None, None, None),
        (200, "upstream_timeout", "upstream_timeout"),
        (502, "upstream_unreachable", "upstream_unreachable"),
    ],
)
def test_an_error_status_is_recorded_as_an_error(
    status: int | None, error: str | None, recorded: str | None
) -> None:
    record = to_record(
        exchange(chat_answer(), status=status, error=error), 5.0, "none", "proxy", hash_key=KEY
    )
    assert record.status == status
    assert record.error == recorded


def test_a_record_of_a_served_answer_field_by_field() -> None:
    x = exchange(
        chat_answer(),
        identity="header",
        cohort="beta",
        fallback_from="vllm",
        first_byte=100.25,
    )
    record = to_record(x, 1234.5, "redacted", "proxy", hash_key=KEY)
    assert (record.request_id, record.ts, record.route, record.backend, record.role) == (
        "req-1",
        1234.5,
        "chat/completions",
        "openai",
        "serve",
    )
    assert type(record.role) is str
    assert (record.model, record.served_model, record.turn, record.stream) == (
        "gpt-4o",
        "gpt-4o-2024",
        2,
        False,
    )
    assert record.conversation == "k:d822268defd11b1a51306672"
    assert record.response_id == stored_conversation("chatcmpl-1", "redacted", KEY)
    assert record.latency_ms == 1500.0
    assert record.ttft_ms is None  # not streamed: its first byte is its last
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (11, 3, None)
    assert record.finish_reason == "stop"
    assert record.tool_calls is None
    assert (record.fallback_from, record.pair_id, record.source, record.content) == (
        "vllm",
        None,
        "proxy",
        "redacted",
    )
    assert (record.identity, record.cohort) == ("header", "beta")
    assert orjson.loads(record.response_json or "null") == chat_answer()
    assert record.request_json is not None


def test_empty_identity_and_cohort_are_recorded_as_none() -> None:
    record = to_record(exchange(chat_answer()), 1.0, "none", "proxy", hash_key=KEY)
    assert (record.identity, record.cohort) == (None, None)
    assert (record.request_json, record.response_json) == (None, None)


def test_full_content_keeps_the_ids_as_they_were() -> None:
    x = exchange(chat_answer(), conversation="alice@example.com", conversation_in_store="k:stored")
    record = to_record(x, 1.0, "full", "proxy", hash_key=KEY)
    assert record.conversation == "alice@example.com"
    assert record.response_id == "chatcmpl-1"
    # Otherwise the conversation is grouped by the key the store knows it by.
    record = to_record(x, 1.0, "none", "proxy", hash_key=KEY)
    assert record.conversation == stored_conversation("k:stored", "none", KEY)


@pytest.mark.parametrize("content", ["none", "redacted"])
def test_unless_content_is_full_no_declared_id_is_stored_as_it_came(content: str) -> None:
    """An email as the conversation and the answer's id: both become keyed hashes, the same
    under `none` as under `redacted` (a metrics-only record is not a way around hashing)."""
    x = exchange(chat_answer(id="resp_abc"), conversation="jane@example.com")
    record = to_record(x, 1.0, content, "proxy", hash_key=KEY)
    for stored, raw in (
        (record.conversation, "jane@example.com"),
        (record.response_id, "resp_abc"),
    ):
        assert stored is not None
        assert stored.startswith("k:")
        assert len(stored) == 26
        assert raw not in stored
    redacted = to_record(x, 1.0, "redacted", "proxy", hash_key=KEY)
    assert (record.conversation, record.response_id) == (
        redacted.conversation,
        redacted.response_id,
    )


@pytest.mark.parametrize(
    ("role", "answer", "response_id"),
    [
        (Role.SERVE, chat_answer(), "k:"),
        (Role.SHADOW, chat_answer(), None),
        (Role.NOISE, chat_answer(), None),
        (Role.SERVE, chat_answer(id=""), None),
        (Role.SERVE, chat_answer(id=7), None),
        (Role.SERVE, None, None),
    ],
)
def test_only_the_answer_a_client_got_has_a_response_id(
    role: Role, answer: Any, response_id: str | None
) -> None:
    body = b"" if answer is None else None
    record = to_record(
        exchange(answer, body=body, role=role), 1.0, "redacted", "proxy", hash_key=KEY
    )
    if response_id is None:
        assert record.response_id is None
    else:
        assert record.response_id == stored_conversation("chatcmpl-1", "redacted", KEY)


def test_without_a_key_ids_are_hashed_with_a_fresh_one() -> None:
    x = exchange(chat_answer())
    a = to_record(x, 1.0, "redacted", "proxy")
    b = to_record(x, 1.0, "redacted", "proxy")
    assert a.conversation.startswith("k:")
    assert a.conversation != b.conversation
    assert a.response_id is not None
    assert a.response_id.startswith("k:")
    assert a.response_id != b.response_id


def test_a_streamed_answer_has_ttft_and_decode_timings() -> None:
    body = (
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
        b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"length"}],'
        b'"usage":{"prompt_tokens":5,"completion_tokens":9}}\n\n'
        b"data: [DONE]\n\n"
    )
    x = exchange(
        body=body,
        stream=True,
        first_byte=100.25,
        last_chunk=101.0,
        later_chunks=4,
        max_chunk_gap=0.5,
    )
    record = to_record(x, 1.0, "none", "proxy", hash_key=KEY)
    assert record.ttft_ms == 250.0
    assert record.latency_ms == 1500.0
    assert (record.decode_ms, record.decode_chunks, record.chunk_gap_max_ms) == (750.0, 4, 500.0)
    assert (record.prompt_tokens, record.completion_tokens, record.finish_reason) == (
        5,
        9,
        "length",
    )


def test_an_unfinished_exchange_has_no_latency() -> None:
    record = to_record(exchange(chat_answer(), finished=None), 1.0, "none", "proxy", hash_key=KEY)
    assert record.latency_ms is None
    assert record.decode_ms is None


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def delta(text: str, **extra: Any) -> dict[str, Any]:
    return {"id": "c9", "choices": [{"index": 0, "delta": {"content": text}}]} | extra


END = {
    "id": "c9",
    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 300},
}


@pytest.mark.parametrize("content", ["none", "redacted"])
@pytest.mark.parametrize("chunks", [1, 400])
def test_a_streamed_chat_answer_gives_its_usage_and_reason_whatever_its_length(
    content: str, chunks: int
) -> None:
    # Past 4 KB a metrics-only record reads the stream's last events from a whole line on.
    body = sse(*[delta("word ") for _ in range(chunks)], END)
    x = exchange(body=body, stream=True, first_byte=100.1)
    record = to_record(x, 1.0, content, "proxy", hash_key=KEY)
    assert (record.prompt_tokens, record.completion_tokens, record.finish_reason) == (
        7,
        300,
        "stop",
    )
    assert record.response_id == stored_conversation("c9", content, KEY)
    if content == "redacted":
        stored = orjson.loads(record.response_json or "null")
        assert stored["choices"][0]["message"]["content"] == "word " * chunks


def test_a_tool_call_in_an_early_chunk_is_found_in_a_long_stream() -> None:
    call = {
        "id": "c9",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "t1",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": "{}"},
                        }
                    ]
                },
            }
        ],
    }
    body = sse(
        call,
        *[delta("x") for _ in range(300)],
        END | {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    record = to_record(
        exchange(body=body, stream=True, first_byte=100.1), 1.0, "none", "proxy", hash_key=KEY
    )
    assert record.tool_calls == '["lookup"]'
    assert record.finish_reason == "tool_calls"


def test_a_stream_whose_tail_is_not_json_still_gives_its_figures() -> None:
    body = sse(delta("a"), END) + b"data: {not json\n\n"
    record = to_record(
        exchange(body=body, stream=True, first_byte=100.1), 1.0, "none", "proxy", hash_key=KEY
    )
    assert (record.prompt_tokens, record.completion_tokens) == (7, 300)


@pytest.mark.parametrize(
    ("route", "kept"),
    [
        ("chat/completions", True),
        ("completions", True),
        ("responses", True),
        ("messages", True),
        ("embeddings", False),
        ("models", False),
    ],
)
def test_only_text_routes_keep_their_answer(route: str, kept: bool) -> None:
    record = to_record(
        exchange({"id": "x", "object": "list", "data": []}, route=route),
        1.0,
        "redacted",
        "proxy",
        hash_key=KEY,
    )
    assert (record.response_json is not None) is kept


@pytest.mark.parametrize(
    ("answer", "prompt", "completion"),
    [
        ({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}, 3, 4),
        ({"response": {"usage": {"input_tokens": 5, "output_tokens": 6}}}, 5, 6),
        ({"usage": None, "response": {"usage": {"input_tokens": 5, "output_tokens": 6}}}, 5, 6),
        ({"usage": "many"}, None, None),
        ({"response": "x"}, None, None),
        ({}, None, None),
    ],
)
def test_usage_is_read_where_each_api_puts_it(
    answer: dict[str, Any], prompt: int | None, completion: int | None
) -> None:
    record = to_record(exchange(answer, route="embeddings"), 1.0, "none", "proxy", hash_key=KEY)
    assert (record.prompt_tokens, record.completion_tokens) == (prompt, completion)


@pytest.mark.parametrize(
    ("body", "prompt"),
    [(b"", None), (b"not json", None), (b"[1, 2]", None), (b'{"usage": {"prompt_tokens": 8}}', 8)],
)
def test_an_answer_that_is_not_an_object_has_no_figures(body: bytes, prompt: int | None) -> None:
    record = to_record(exchange(body=body, route="embeddings"), 1.0, "none", "proxy", hash_key=KEY)
    assert record.prompt_tokens == prompt


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (None, None),
        ({"choices": [{"finish_reason": "length"}]}, "length"),
        ({"choices": [{"finish_reason": 3}]}, None),
        ({"choices": [{}], "object": "response", "status": "completed"}, None),
        ({"choices": ["x"], "object": "response", "status": "completed"}, "completed"),
        ({"choices": [], "object": "response", "status": "completed"}, "completed"),
        (
            {
                "object": "response",
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
            },
            "max_output_tokens",
        ),
        (
            {"object": "response", "status": "incomplete", "incomplete_details": {"reason": 1}},
            "incomplete",
        ),
        ({"object": "response", "status": "completed", "incomplete_details": None}, "completed"),
        ({"object": "response", "status": 5}, None),
        ({"object": "response"}, None),
        ({"type": "message", "stop_reason": "end_turn"}, "end_turn"),
        ({"type": "message", "stop_reason": None}, None),
        ({"type": "message", "stop_reason": 5}, None),
        ({"type": "other", "stop_reason": "end_turn"}, None),
        ({"stop_reason": "end_turn"}, None),
        ({"choices": "stop"}, None),
    ],
)
def test_finish_reason_of_each_answer_shape(
    response: dict[str, Any] | None, reason: str | None
) -> None:
    assert finish_reason(response) == reason


def tool_call(name: Any) -> dict[str, Any]:
    return {"id": "t", "type": "function", "function": {"name": name, "arguments": "{}"}}


@pytest.mark.parametrize(
    ("response", "names"),
    [
        (None, []),
        ({}, []),
        (
            {
                "choices": [
                    {"message": {"tool_calls": [tool_call("a"), tool_call("b")]}},
                    {"message": {"tool_calls": [tool_call("c")]}},
                ]
            },
            ["a", "b", "c"],
        ),
        (
            {
                "choices": [
                    {
                        "message": {
                            "tool_calls": [tool_call(1), {"function": "x"}, "y", tool_call("ok")]
                        }
                    }
                ]
            },
            ["ok"],
        ),
        ({"choices": ["x", {"message": None}, {}, {"message": {"tool_calls": None}}]}, []),
        (
            {
                "output": [
                    {"type": "function_call", "name": "f"},
                    {"type": "custom_tool_call", "name": "g"},
                    {"type": "message", "name": "m"},
                    {"type": "function_call", "name": 2},
                    "z",
                ]
            },
            ["f", "g"],
        ),
        (
            {
                "type": "message",
                "content": [
                    {"type": "text", "text": "t"},
                    {"type": "tool_use", "name": "h"},
                    {"type": "tool_use", "name": None},
                    "q",
                ],
            },
            ["h"],
        ),
        ({"type": "other", "content": [{"type": "tool_use", "name": "h"}]}, []),
        ({"type": "message", "content": None}, []),
    ],
)
def test_tool_call_names_of_each_answer_shape(
    response: dict[str, Any] | None, names: list[str]
) -> None:
    assert tool_call_names(response) == names


def test_a_record_lists_its_tool_calls_as_json() -> None:
    answer = chat_answer(
        choices=[
            {
                "index": 0,
                "message": {"tool_calls": [tool_call("a"), tool_call("b")]},
                "finish_reason": "tool_calls",
            }
        ]
    )
    record = to_record(exchange(answer), 1.0, "none", "proxy", hash_key=KEY)
    assert record.tool_calls == '["a","b"]'


def test_the_converter_pairs_a_shadow_copy_with_the_answer_it_shadows() -> None:
    convert = RecordConverter("none", "proxy", hash_key=KEY)
    served = exchange(chat_answer(), has_shadow_copy=True)
    copy = exchange(
        chat_answer(), request_id="req-2", backend="vllm", role=Role.SHADOW, pair_id="req-1"
    )
    stray = exchange(
        chat_answer(), request_id="req-3", backend="vllm", role=Role.SHADOW, pair_id="req-9"
    )
    first = convert((served, 1.0))
    assert first.parity_kind is None
    paired = convert((copy, 2.0))
    assert paired.pair_id == "req-1"
    assert paired.parity_kind == "candidate"
    assert paired.parity_score == 1.0
    assert paired.conversation == "k:d822268defd11b1a51306672"
    unpaired = convert((stray, 3.0))
    assert unpaired.parity_kind is None


def test_a_noise_call_is_scored_as_noise() -> None:
    convert = RecordConverter("none", "proxy", hash_key=KEY)
    convert((exchange(chat_answer(), has_shadow_copy=True), 1.0))
    noise = exchange(chat_answer(), request_id="req-2", role=Role.NOISE, pair_id="req-1")
    assert convert((noise, 2.0)).parity_kind == "noise"


def test_the_converter_forgets_the_oldest_answers_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("kvmigrate.recorder.convert.MAX_ORIGINALS", 2)
    convert = RecordConverter("none", "proxy", hash_key=KEY)
    for i in range(3):
        convert((exchange(chat_answer(), request_id=f"r{i}", has_shadow_copy=True), 1.0))
    copies = [
        exchange(chat_answer(), request_id=f"c{i}", role=Role.SHADOW, pair_id=f"r{i}")
        for i in range(3)
    ]
    assert [convert((c, 2.0)).parity_kind for c in copies] == [None, "candidate", "candidate"]


@pytest.mark.parametrize("content", ["everything", "", "Full"])
def test_the_converter_refuses_an_unknown_content_policy(content: str) -> None:
    with pytest.raises(
        ValueError, match=r"content must be one of \('none', 'redacted', 'full'\), got "
    ):
        RecordConverter(content, "proxy")


def test_the_converter_keeps_its_settings() -> None:
    convert = RecordConverter("full", "replay", hash_key=KEY)
    assert (convert.content, convert.source, convert.hash_key) == ("full", "replay", KEY)
    assert len(RecordConverter("none", "proxy").hash_key) == 32
    record = convert((exchange(chat_answer()), 9.0))
    assert (record.source, record.content, record.ts) == ("replay", "full", 9.0)


SECRET_REQUEST = (
    b'{"model":"gpt-4o","messages":[{"role":"user","content":"my key is '
    b'sk-proj-abcdefghijklmnopqrstuvwxyz0123456789 and mail bob@example.com"}],'
    b'"user":"sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"}'
)
SECRET = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"


def stored_text(record: Any) -> str:
    """Everything a record keeps of the request and the answer, as text."""
    rows = " ".join(row.body for row in record.messages or ())
    return f"{record.request_json} {record.response_json} {rows}"


@pytest.mark.parametrize(("content", "kept"), [("redacted", False), ("full", True)])
def test_redacted_records_keep_no_secret_in_the_request_its_history_or_the_answer(
    content: str, kept: bool
) -> None:
    answer = chat_answer(
        choices=[
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"echo {SECRET}"},
                "finish_reason": "stop",
            }
        ]
    )
    x = exchange(answer)
    x.request_body = SECRET_REQUEST
    record = to_record(x, 1.0, content, "proxy", hash_key=KEY)
    assert record.messages
    assert record.request_json is not None
    assert record.response_json is not None
    text = stored_text(record)
    assert (SECRET in text) is kept
    assert ("bob@example.com" in text) is kept
    # each part on its own, so that none of them escapes redaction
    assert (SECRET in record.request_json) is kept
    assert (SECRET in record.response_json) is kept
    assert any("bob@example.com" in row.body for row in record.messages) is kept


def test_an_answer_that_is_not_json_stores_no_answer() -> None:
    record = to_record(
        exchange(body=b"<html>bad gateway</html>", status=502),
        1.0,
        "redacted",
        "proxy",
        hash_key=KEY,
    )
    assert record.response_json is None
    assert record.request_json is not None


def nested(levels: int) -> bytes:
    return b"[" * levels + b'"x"' + b"]" * levels


def depth_to_marker(value: Any) -> tuple[int, Any]:
    levels = 0
    while isinstance(value, list):
        value, levels = value[0], levels + 1
    return levels, value


@pytest.mark.parametrize("content", ["redacted", "full"])
@pytest.mark.parametrize(
    ("levels", "stored_levels", "leaf"),
    [
        # the message object is level 0 of a stored history row: 128 levels, the last a marker
        (126, 126, "x"),
        (127, 127, "x"),
        (128, 127, "[kvmigrate: nested too deeply to record]"),
        (300, 127, "[kvmigrate: nested too deeply to record]"),
    ],
)
def test_a_history_nested_past_what_orjson_writes_is_cut_at_128_levels(
    content: str, levels: int, stored_levels: int, leaf: str
) -> None:
    x = exchange(chat_answer())
    x.request_body = b'{"model":"m","messages":[{"role":"user","content":' + nested(levels) + b"}]}"
    record = to_record(x, 1.0, content, "proxy", hash_key=KEY)
    if levels < 250:  # orjson writes these whole: no cut at all
        (row,) = record.messages or ()
        assert depth_to_marker(orjson.loads(row.body)["content"]) == (levels, "x")
        return
    (row,) = record.messages or ()
    assert depth_to_marker(orjson.loads(row.body)["content"]) == (stored_levels, leaf)


@pytest.mark.parametrize("content", ["redacted", "full"])
def test_a_request_deeper_than_the_history_reader_is_stored_whole_and_cut(content: str) -> None:
    # msgspec stops short of the 1,024 levels the proxy accepts: the request is kept whole,
    # its deepest parts a marker 128 levels down (request, messages, message, content: 3).
    x = exchange(chat_answer())
    x.request_body = b'{"model":"m","messages":[{"role":"user","content":' + nested(1000) + b"}]}"
    record = to_record(x, 1.0, content, "proxy", hash_key=KEY)
    assert not record.messages
    stored = orjson.loads(record.request_json or "null")
    assert stored["model"] == "m"
    assert depth_to_marker(stored["messages"][0]["content"]) == (
        125,
        "[kvmigrate: nested too deeply to record]",
    )


def test_a_request_deeper_than_the_history_reader_that_is_not_json_is_not_stored() -> None:
    x = exchange(chat_answer())
    x.request_body = b'{"model":"m","messages":[{"role":"user","content":' + nested(1000) + b"}]"
    record = to_record(x, 1.0, "redacted", "proxy", hash_key=KEY)
    assert record.request_json is None
    assert not record.messages


def test_a_deep_request_stored_whole_is_redacted() -> None:
    x = exchange(chat_answer())
    x.request_body = (
        b'{"model":"m","note":"'
        + SECRET.encode()
        + b'","messages":[{"role":"user","content":'
        + nested(1000)
        + b"}]}"
    )
    record = to_record(x, 1.0, "redacted", "proxy", hash_key=KEY)
    assert record.request_json is not None
    assert SECRET not in record.request_json


def test_a_streamed_shadow_copy_is_scored_on_its_whole_text_even_without_content() -> None:
    convert = RecordConverter("none", "proxy", hash_key=KEY)
    served = exchange(
        body=sse(delta("hello "), delta("world"), END),
        stream=True,
        first_byte=100.1,
        has_shadow_copy=True,
    )
    same = exchange(
        body=sse(delta("hello "), delta("world"), END),
        stream=True,
        first_byte=100.1,
        request_id="c1",
        role=Role.SHADOW,
        pair_id="req-1",
    )
    other = exchange(
        body=sse(delta("goodbye"), END),
        stream=True,
        first_byte=100.1,
        request_id="c2",
        role=Role.SHADOW,
        pair_id="req-1",
    )
    convert((served, 1.0))
    assert convert((same, 2.0)).parity_score == 1.0
    assert (convert((other, 3.0)).parity_score or 0.0) < 1.0


def sized(events: list[bytes], size: int, pad_in: int = 0) -> bytes:
    """An SSE body of exactly `size` bytes, event `pad_in` padded with a `pad` member."""
    body = b"".join(events)
    padded = events[pad_in].replace(
        b'"id":', b'"pad":"' + b"p" * (size - len(body) - 9) + b'","id":', 1
    )
    out = b"".join([*events[:pad_in], padded, *events[pad_in + 1 :]])
    assert len(out) == size
    return out


def frame(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


@pytest.mark.parametrize("size", [4095, 4096, 4097, 9000])
def test_a_streamed_answer_around_the_tail_window_keeps_every_figure(size: int) -> None:
    # the tail window starts before, at or inside the first event
    events = [
        frame({"id": "c9", "choices": [{"index": 0, "delta": {"content": "a"}}]}),
        frame({"id": "c9", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        frame({"id": "c9", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}),
        b"data: [DONE]\n\n",
    ]
    body = sized(events, size)
    record = to_record(
        exchange(body=body, stream=True, first_byte=100.1), 1.0, "none", "proxy", hash_key=KEY
    )
    assert (record.prompt_tokens, record.completion_tokens, record.finish_reason) == (4, 2, "stop")
    assert record.response_id == stored_conversation("c9", "none", KEY)


@pytest.mark.parametrize("size", [4097, 5000, 20000])
def test_a_last_event_longer_than_the_tail_window_keeps_every_figure(size: int) -> None:
    # A final chunk over 4 KB (one with logprobs, or a server that sends the text at once):
    # the tail window starts inside it.
    events = [
        frame({"id": "c9", "choices": [{"index": 0, "delta": {"content": "a"}}]}),
        frame(
            {
                "id": "c9",
                "choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 6, "completion_tokens": 8},
            }
        ),
        b"data: [DONE]\n\n",
    ]
    body = sized(events, size, pad_in=1)
    record = to_record(
        exchange(body=body, stream=True, first_byte=100.1), 1.0, "none", "proxy", hash_key=KEY
    )
    assert (record.prompt_tokens, record.completion_tokens, record.finish_reason) == (
        6,
        8,
        "length",
    )
    assert record.response_id == stored_conversation("c9", "none", KEY)


@pytest.mark.parametrize("content", ["none", "redacted"])
def test_a_shadowed_answer_in_many_chunks_keeps_its_figures_and_scores_its_copy(
    content: str,
) -> None:
    convert = RecordConverter(content, "proxy", hash_key=KEY)
    events = [frame(delta("hello ")), frame(delta("world")), frame(END), b"data: [DONE]\n\n"]
    served = exchange(body=events[0], stream=True, first_byte=100.1, has_shadow_copy=True)
    served.chunks.extend(events[1:])
    record = convert((served, 1.0))
    assert (record.prompt_tokens, record.completion_tokens, record.finish_reason) == (
        7,
        300,
        "stop",
    )
    assert record.response_id == stored_conversation("c9", content, KEY)
    copy = exchange(
        body=b"".join(events),
        stream=True,
        first_byte=100.1,
        request_id="c1",
        role=Role.SHADOW,
        pair_id="req-1",
    )
    assert convert((copy, 2.0)).parity_score == 1.0
    other = exchange(
        body=sse(delta("hello there"), END),
        stream=True,
        first_byte=100.1,
        request_id="c2",
        role=Role.SHADOW,
        pair_id="req-1",
    )
    assert (convert((other, 3.0)).parity_score or 0.0) < 1.0


# The metrics-only fast path: a streamed chat answer's figures read off its last events,
# not its whole reassembly (most of a record's cost). What it reads, exactly, and when it
# gives way to the whole stream.
TAIL_SUMMARY = {
    "id": "c9",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 300},
}


@pytest.mark.parametrize("chunks", [1, 100, 400, 1000])
def test_the_tail_reads_a_long_streams_figures_off_its_last_events(chunks: int) -> None:
    body = sse(*[delta("word ") for _ in range(chunks)], END)
    assert _stream_tail(body) == TAIL_SUMMARY
    assert _answer("chat/completions", body, metrics_only=True) == TAIL_SUMMARY


@pytest.mark.parametrize("size", [4095, 4096, 4097, 5000])
def test_the_tail_at_the_edge_of_its_window(size: int) -> None:
    events = [frame(delta("a")), frame(delta("b")), frame(END), b"data: [DONE]\n\n"]
    assert _stream_tail(sized(events, size)) == TAIL_SUMMARY


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (sse(delta("a"), delta("b")), "no finish reason: a broken stream"),
        (sse(delta("a"), END) + b"data: {not json\n\n", "an event that is not JSON"),
        (sse(delta("a"), END | {"choices": "stop"}), "choices that are not a list"),
        (
            sse(delta("a"), END | {"choices": [{"index": 0, "finish_reason": ""}]}),
            "an empty reason",
        ),
    ],
)
def test_the_tail_gives_way_to_the_whole_stream(body: bytes, why: str) -> None:
    assert _stream_tail(body) is None, why


@pytest.mark.parametrize(
    ("route", "body", "metrics_only", "tail"),
    [
        ("chat/completions", sse(delta("hi"), END), True, True),
        ("chat/completions", sse(delta("hi"), END), False, False),
        ("completions", sse(delta("hi"), END), True, False),
        ("chat/completions", orjson.dumps(chat_answer()), True, False),
        # a tool call's name may be in any chunk; a second choice interleaves with the first
        ("chat/completions", sse(delta("hi") | {"tool_calls": []}, END), True, False),
        (
            "chat/completions",
            sse({"id": "c9", "choices": [{"index": 1, "delta": {"content": "x"}}]}, END),
            True,
            False,
        ),
    ],
)
def test_when_the_fast_path_is_taken(
    route: str, body: bytes, metrics_only: bool, tail: bool
) -> None:
    answer = _answer(route, body, metrics_only=metrics_only)
    assert answer is not None
    assert (answer == _stream_tail(body)) is tail
    assert answer.get("usage") == (
        chat_answer()["usage"] if body.startswith(b"{") else END["usage"]
    )


def test_a_pair_too_deep_to_score_is_kept_as_an_unscored_pair() -> None:
    arguments = b"[" * 1000 + b"]" * 1000
    body = (
        b'{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"a",'
        b'"tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"'
        + arguments
        + b'"}}]},"finish_reason":"stop"}]}'
    )
    convert = RecordConverter("none", "proxy", hash_key=KEY)
    convert((exchange(body=body, has_shadow_copy=True), 1.0))
    record = convert((exchange(body=body, request_id="c", role=Role.SHADOW, pair_id="req-1"), 2.0))
    assert (
        record.parity_kind,
        record.parity_score,
        record.parity_applicable,
        record.parity_disagree,
    ) == (
        "candidate",
        None,
        "[]",
        "[]",
    )
    assert (record.parity_tool_agree, record.parity_json_valid) == (None, None)


def test_a_deep_request_stored_whole_under_full_content_keeps_its_text() -> None:
    x = exchange(chat_answer())
    x.request_body = (
        b'{"model":"m","note":"'
        + SECRET.encode()
        + b'","messages":[{"role":"user","content":'
        + nested(1000)
        + b"}]}"
    )
    record = to_record(x, 1.0, "full", "proxy", hash_key=KEY)
    assert record.request_json is not None
    assert SECRET in record.request_json
