"""Reassembling very long streamed answers: every route's deltas come back whole, the work
of joining them is linear (no piece is copied again for each delta after it), and the
sliced reassembly the proxy's process uses gives exactly what reading the body at once
gives. How long it takes is benchmarks/loop_stall.py's to print, not a test's to time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmigrate.proxy.stream_check import SseCheck
from kvmigrate.slices import run_through
from kvmigrate.wire.anthropic_stream import MessagesStream
from kvmigrate.wire.assemble import assemble, assemble_sliced
from kvmigrate.wire.chat_stream import assemble_chat_dicts
from kvmigrate.wire.responses_stream import ResponsesStream
from kvmigrate.wire.sse import LineDecoder

N = 100_000
# Pieces as a model streams them: short, with JSON's escapes and text beyond ASCII.
PIECES = ['{"path": "', "src/", "m\u00e9", '\\"q\\"', " ", "\u4e2d", "x" * 7, "\\n"]


def pieces(n: int = N) -> list[str]:
    return [PIECES[i % len(PIECES)] for i in range(n)]


def sse(events: Iterator[tuple[str | None, dict[str, Any]]]) -> bytes:
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        out.append(f"{head}data: {json.dumps(data)}\n\n".encode())
    return b"".join(out)


# -- chat ----------------------------------------------------------------------------------


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [choice],
    }


def chat_tool_call(parts: list[str]) -> list[dict[str, Any]]:
    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "write"}}
    chunks = [chat_chunk({"role": "assistant", "tool_calls": [head]})]
    for part in parts:
        chunks.append(chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}))
    return [*chunks, chat_chunk({}, "tool_calls")]


def chat_body(chunks: list[dict[str, Any]]) -> bytes:
    events = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return events + b"data: [DONE]\n\n"


def test_a_chat_tool_call_of_100000_argument_deltas_comes_back_whole() -> None:
    parts = pieces()
    body = chat_body(chat_tool_call(parts))
    for answer in (
        assemble("chat/completions", body),
        run_through(assemble_sliced("chat/completions", body)),
    ):
        assert answer is not None
        [call] = answer["choices"][0]["message"]["tool_calls"]
        assert call["function"] == {"name": "write", "arguments": "".join(parts)}
        assert call["id"] == "call_1"
        assert answer["choices"][0]["finish_reason"] == "tool_calls"


# -- Responses -----------------------------------------------------------------------------


def responses_events(parts: list[str], ended: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    snapshot = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    yield "response.created", {"type": "response.created", "response": snapshot}
    item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "write"}
    added = {"type": "response.output_item.added", "output_index": 0, "item": item}
    yield "response.output_item.added", {**added, "item": {**item, "arguments": ""}}
    for part in parts:
        delta = {"item_id": "fc_1", "output_index": 0, "delta": part}
        yield (
            "response.function_call_arguments.delta",
            {
                "type": "response.function_call_arguments.delta",
                **delta,
            },
        )
    if ended:
        whole = {**item, "arguments": "".join(parts), "status": "completed"}
        done = {**snapshot, "status": "completed", "output": [whole]}
        yield "response.completed", {"type": "response.completed", "response": done}


@pytest.mark.parametrize("ended", [True, False], ids=["whole", "cut-short"])
def test_a_responses_function_call_of_100000_deltas_comes_back_whole(ended: bool) -> None:
    parts = pieces()
    body = sse(responses_events(parts, ended))
    for answer in (assemble("responses", body), run_through(assemble_sliced("responses", body))):
        assert answer is not None
        [call] = answer["output"]
        assert call["type"] == "function_call"
        assert (call["name"], call["call_id"]) == ("write", "call_1")
        assert call["arguments"] == "".join(parts)
        assert answer["status"] == ("completed" if ended else "in_progress")


# -- Anthropic Messages --------------------------------------------------------------------


def block_events(
    index: int, block: dict[str, Any], deltas: list[dict[str, Any]]
) -> Iterator[tuple[str, dict[str, Any]]]:
    start = {"type": "content_block_start", "index": index, "content_block": block}
    yield "content_block_start", start
    for delta in deltas:
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    yield "content_block_stop", {"type": "content_block_stop", "index": index}


def messages_events(n: int) -> Iterator[tuple[str, dict[str, Any]]]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {}}
    yield "message_start", {"type": "message_start", "message": message}
    thinking = [{"type": "thinking_delta", "thinking": p} for p in pieces(n)]
    thinking.append({"type": "signature_delta", "signature": "sig"})
    yield from block_events(0, {"type": "thinking", "thinking": ""}, thinking)
    text = [{"type": "text_delta", "text": p} for p in pieces(n)]
    text += [
        {"type": "citations_delta", "citation": {"cited_text": str(i)}} for i in range(n // 10)
    ]
    yield from block_events(1, {"type": "text", "text": ""}, text)
    arguments = json.dumps({"content": "".join(pieces(n))})
    inputs = [{"type": "input_json_delta", "partial_json": p} for p in _cut(arguments, n)]
    tool = {"type": "tool_use", "id": "toolu_1", "name": "write", "input": {}}
    yield from block_events(2, tool, inputs)
    yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}}
    yield "message_stop", {"type": "message_stop"}


def _cut(text: str, n: int) -> list[str]:
    size = -(-len(text) // max(n, 1))
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_anthropic_text_thinking_citations_and_tool_input_of_100000_deltas_come_back_whole() -> (
    None
):
    body = sse(messages_events(N))
    joined = "".join(pieces())
    for answer in (assemble("messages", body), run_through(assemble_sliced("messages", body))):
        assert answer is not None
        thinking, text, tool = answer["content"]
        assert thinking == {"type": "thinking", "thinking": joined, "signature": "sig"}
        assert text["text"] == joined
        assert text["citations"] == [{"cited_text": str(i)} for i in range(N // 10)]
        assert tool["input"] == {"content": joined}
        assert answer["stop_reason"] == "tool_use"


# -- the work of joining -------------------------------------------------------------------


class Counted(str):
    """A piece that counts the characters every `+` it takes part in copies: joining the
    pieces once copies none; growing a string piece by piece copies it again each time."""

    copied = 0

    def __add__(self, other: str) -> Counted:
        Counted.copied += len(self) + len(other)
        return Counted(str.__add__(self, other))

    def __radd__(self, other: str) -> Counted:
        Counted.copied += len(self) + len(other)
        return Counted(str.__add__(other, self))


@pytest.fixture
def counted() -> type[Counted]:
    Counted.copied = 0
    return Counted


def test_chat_deltas_are_joined_once(counted: type[Counted]) -> None:
    parts = [counted(p) for p in pieces(20_000)]
    answer = assemble_chat_dicts(chat_tool_call(parts))  # dicts: the pieces are ours
    assert answer is not None
    arguments = answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert arguments == "".join(parts)
    # Piece by piece this was 20,000 copies of a string growing to 300,000 characters.
    assert counted.copied <= 2 * len(arguments)


def test_anthropic_deltas_are_joined_once(counted: type[Counted]) -> None:
    stream = MessagesStream()
    for _name, event in messages_events(20_000):
        delta = event.get("delta", {})
        for key in ("text", "thinking", "partial_json"):
            if isinstance(delta.get(key), str):
                delta[key] = counted(delta[key])
        stream.add(event)
    answer = stream.result()
    assert answer is not None
    total = sum(len(b.get("text") or b.get("thinking") or "") for b in answer["content"])
    assert total == 2 * len("".join(pieces(20_000)))
    assert counted.copied <= 2 * total


def test_responses_deltas_are_joined_once(counted: type[Counted]) -> None:
    stream = ResponsesStream()
    parts = [counted(p) for p in pieces(20_000)]
    for name, data in responses_events(parts, ended=False):
        stream.add(name, data)
    answer = stream.result()
    assert answer is not None
    assert answer["output"][0]["arguments"] == "".join(parts)
    assert counted.copied <= 2 * len(answer["output"][0]["arguments"])


# -- sliced and whole agree ----------------------------------------------------------------

TEXT = st.text(max_size=6)
CHAT_CHUNK = st.one_of(
    TEXT.map(lambda t: chat_chunk({"content": t})),
    TEXT.map(lambda t: chat_chunk({"reasoning_content": t})),
    st.tuples(st.integers(0, 2), TEXT).map(
        lambda p: chat_chunk({"tool_calls": [{"index": p[0], "function": {"arguments": p[1]}}]})
    ),
    st.just(chat_chunk({}, "stop")),
    st.just({"id": "c", "choices": [{"index": None, "delta": {"content": 3}}]}),  # odd types
)


@settings(max_examples=60, deadline=None)
@given(st.lists(CHAT_CHUNK, min_size=1, max_size=40), st.integers(1, 400))
def test_sliced_chat_reassembly_is_the_whole_one(chunks: list[dict[str, Any]], size: int) -> None:
    body = chat_body(chunks)
    assert run_through(assemble_sliced("chat/completions", body, size)) == assemble(
        "chat/completions", body
    )


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 30), st.integers(1, 300), st.booleans())
def test_sliced_reassembly_is_the_whole_one_for_every_route(n: int, size: int, cut: bool) -> None:
    bodies = {
        "messages": sse(messages_events(n)),
        "responses": sse(responses_events(pieces(n), ended=not cut)),
        "completions": sse(
            (None, {"id": "c", "choices": [{"index": i % 2, "text": p}]})
            for i, p in enumerate(pieces(n))
        ),
    }
    for route, body in bodies.items():
        if cut:
            body = body[: len(body) * 2 // 3]
        sliced = run_through(assemble_sliced(route, body, size))
        assert sliced == assemble(route, body), route


# -- a long line in small chunks -----------------------------------------------------------


def test_a_long_line_in_small_chunks_comes_out_whole_and_is_judged_by_its_start() -> None:
    line = b"data: " + orjson.dumps({"a": "b" * 1_000_000})
    decoder, check = LineDecoder(), SseCheck()
    out: list[bytes] = []
    for i in range(0, len(line), 100):
        out += decoder.feed(line[i : i + 100])
        assert check.feed(line[i : i + 100])
        assert decoder.pending_size == min(i + 100, len(line))
    assert decoder.pending_head(6) == b"data: "
    out += decoder.feed(b"\r")
    assert out == [line]
    assert decoder.feed(b"\n") == []  # the `\n` of a `\r\n` cut between two chunks
    assert check.feed(b"\n\n")
    assert not SseCheck().feed(b"datum" + b"x" * 1000)
