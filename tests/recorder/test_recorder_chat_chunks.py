"""The typed fast path reassembles streamed chat answers exactly as the general path does."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmigrate.proxy.exchange import Exchange
from kvmigrate.recorder.convert import to_record
from kvmigrate.wire.assemble import assemble
from kvmigrate.wire.chat_chunks import plain_choice
from kvmigrate.wire.chat_stream import assemble_chat_dicts
from kvmigrate.wire.sse import sse_data

TEXT = st.text(max_size=12)
TOOL_DELTA = st.fixed_dictionaries(
    {"index": st.integers(0, 2)},
    optional={
        "id": st.text(min_size=1, max_size=8),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {}, optional={"name": st.text(max_size=6), "arguments": st.text(max_size=10)}
        ),
    },
)
DELTA = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["assistant", "tool"]),
        "content": st.one_of(st.none(), TEXT),
        "reasoning_content": TEXT,
        "refusal": TEXT,
        "tool_calls": st.lists(TOOL_DELTA, max_size=2),
    },
)
PART = st.fixed_dictionaries(
    {"index": st.integers(0, 1), "delta": DELTA},
    optional={"finish_reason": st.one_of(st.none(), st.sampled_from(["stop", "length"]))},
)
USAGE = st.fixed_dictionaries({"prompt_tokens": st.integers(0, 99)})
CHUNK = st.fixed_dictionaries(
    {"id": st.just("c1"), "object": st.just("chat.completion.chunk"), "model": st.just("m")},
    optional={"choices": st.lists(PART, max_size=2), "usage": st.one_of(st.none(), USAGE)},
)


def _stream(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


@settings(max_examples=300, deadline=None)
@given(st.lists(CHUNK, min_size=1, max_size=8))
def test_the_typed_path_agrees_with_the_general_path(chunks: list[dict[str, Any]]) -> None:
    body = _stream(chunks)
    assert assemble("chat/completions", body) == assemble_chat_dicts(sse_data(body))


def test_chunks_the_types_do_not_admit_take_the_general_path() -> None:
    odd = [
        {"id": "c1", "choices": [{"index": None, "delta": {"content": "a"}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": ["not", "a", "str"]}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": 3}]},
    ]
    body = _stream(odd)
    assembled = assemble("chat/completions", body)
    assert assembled == assemble_chat_dicts(sse_data(body))
    assert assembled is not None
    assert assembled["choices"]


def test_crlf_framing_and_a_stream_cut_mid_event() -> None:
    chunks = [
        {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "lo"}}]},
    ]
    crlf = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks)
    cut = crlf + b'data: {"id":"c1","choices":[{"index":0,"del'
    for body in (crlf, cut):
        assembled = assemble("chat/completions", body)
        assert assembled is not None
        assert assembled["choices"][0]["message"]["content"] == "Hello"


def _streamed(words: int, usage: bool, tool: bool, finish: str | None) -> bytes:
    chunks: list[dict[str, Any]] = [
        {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    ]
    for n in range(words):
        chunks.append({"id": "c1", "choices": [{"index": 0, "delta": {"content": f"w{n} "}}]})
    if tool:
        call = {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": "{}"}}
        chunks.append({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    chunks.append({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if usage:
        counts = {"prompt_tokens": 900, "completion_tokens": words, "total_tokens": 900 + words}
        chunks.append({"id": "c1", "choices": [], "usage": counts})
    return _stream(chunks)


@pytest.mark.parametrize("words", [3, 400])
@pytest.mark.parametrize("usage", [True, False])
@pytest.mark.parametrize("tool", [False, True])
@pytest.mark.parametrize("finish", ["stop", "length", None])
def test_a_metrics_only_record_reads_the_stream_tail_alike(
    words: int, usage: bool, tool: bool, finish: str | None
) -> None:
    """`content: none` skips reassembly where it can; the record must not change."""
    x = Exchange(
        request_id="r", route="chat/completions", backend="hosted", role="serve", model="m",
        served_model="m", conversation="c", turn=1, stream=True, started=0.0,
        request_body=b'{"messages": []}', status=200, first_byte=0.1, finished=0.2,
    )  # fmt: skip
    x.chunks = [_streamed(words, usage, tool, finish)]
    metrics_only, whole = to_record(x, 0.0, "none", "s"), to_record(x, 0.0, "full", "s")
    for field in ("prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason"):
        assert getattr(metrics_only, field) == getattr(whole, field)
    assert metrics_only.tool_calls == whole.tool_calls
    assert (metrics_only.tool_calls is not None) == tool


PLAIN_DELTA = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["assistant", ""]),
        "content": st.one_of(st.none(), TEXT),
        "refusal": st.none(),
        "tool_calls": st.just([]),
    },
)
PLAIN_PART = st.fixed_dictionaries(
    {"index": st.just(0), "delta": PLAIN_DELTA},
    optional={"finish_reason": st.one_of(st.none(), st.sampled_from(["stop", "length"]))},
)
PLAIN_CHUNK = st.fixed_dictionaries(
    {"id": st.just("c1"), "object": st.just("chat.completion.chunk"), "model": st.just("m")},
    optional={
        "choices": st.one_of(st.none(), st.lists(PLAIN_PART, max_size=2)),
        "usage": st.one_of(st.none(), USAGE),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PLAIN_CHUNK, min_size=1, max_size=8))
def test_the_plain_path_takes_text_only_streams_and_agrees(chunks: list[dict[str, Any]]) -> None:
    body = _stream(chunks)
    assert plain_choice(b"[" + b",".join(orjson.dumps(c) for c in chunks) + b"]") is not None
    assert assemble("chat/completions", body) == assemble_chat_dicts(sse_data(body))


@pytest.mark.parametrize(
    "delta",
    [
        {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f"}}]},
        {"reasoning_content": "thinking"},
        {"reasoning": "thinking"},
        {"refusal": "no"},
        {"function_call": {"name": "f"}},
        {"audio": {"id": "a"}},
    ],
)
def test_anything_but_text_leaves_the_plain_path(delta: dict[str, Any]) -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]},
        {"choices": [{"index": 0, "delta": delta}]},
    ]
    assert plain_choice(orjson.dumps(chunks)) is None
    body = _stream(chunks)
    assert assemble("chat/completions", body) == assemble_chat_dicts(sse_data(body))


def test_a_second_choice_leaves_the_plain_path() -> None:
    chunks = [{"choices": [{"index": i, "delta": {"content": str(i)}} for i in (0, 1)]}]
    assert plain_choice(orjson.dumps(chunks)) is None
    assembled = assemble("chat/completions", _stream(chunks))
    assert assembled is not None
    assert [c["message"]["content"] for c in assembled["choices"]] == ["0", "1"]
