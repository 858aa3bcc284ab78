"""Continuity's pure parts, row by row: the encoding of one message (golden bytes, since links
are stored and must match across releases), each wire's adapter on every shape it accepts or
refuses, and where a history's links cut it (the digests spelled out as prefixes of it)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from kvmigrate.policies.continuity import (
    Encoded,
    answer_digest,
    anthropic_answer,
    anthropic_message,
    anthropic_request,
    canonical_arguments,
    chat_answer,
    chat_message,
    chat_request,
    digest_text,
    encode,
    history,
    iter_answer,
    request_history,
    responses_answer,
    responses_item,
    responses_request,
    text_of,
)

# -- one message's bytes --------------------------------------------------------------------

ENCODE_ROWS: list[tuple[str, tuple[Any, ...], dict[str, Any], bytes]] = [
    ("text only", ("user", "hi"), {}, b"user\x1fhi\x1f\x1e"),
    ("empty", ("assistant", ""), {}, b"assistant\x1f\x1f\x1e"),
    ("with ref", ("tool", "21C"), {"ref": "c1"}, b"tool\x1f21C\x1fc1\x1e"),
    (
        "one call",
        ("assistant", "", [("f", '{"b":1,"a":2}')]),
        {},
        b'assistant\x1f\x1f\x1ff\x1f{"a":2,"b":1}\x1e',
    ),
    (
        "two calls in order",
        ("assistant", "x", [("f", "{}"), ("g", "raw")]),
        {},
        b"assistant\x1fx\x1f\x1ff\x1f{}\x1fg\x1fraw\x1e",
    ),
    ("non-ascii", ("user", "zürich"), {}, "user\x1fzürich\x1f\x1e".encode()),
    # A lone surrogate (a client's broken UTF-16) still encodes, as surrogatepass writes it.
    ("lone surrogate", ("user", "a\ud800"), {}, b"user\x1fa\xed\xa0\x80\x1f\x1e"),
]


@pytest.mark.parametrize(
    ("args", "kwargs", "data"), [r[1:] for r in ENCODE_ROWS], ids=[r[0] for r in ENCODE_ROWS]
)
def test_encode_writes_role_text_ref_and_calls(
    args: tuple[Any, ...], kwargs: dict[str, Any], data: bytes
) -> None:
    assert encode(*args, **kwargs) == (args[0], data)


class Unprintable:
    def __str__(self) -> str:
        return "<unprintable>"


CANONICAL_ROWS: list[tuple[str, Any, str]] = [
    ("json object sorted", '{"b": 1, "a": 2}', '{"a":2,"b":1}'),
    ("nested keys sorted", '{"z": {"b": 1, "a": 0}}', '{"z":{"a":0,"b":1}}'),
    ("json array compact", "[2, 1]", "[2,1]"),
    ("json string", '"x"', '"x"'),
    ("not json: as sent", "{city: Rome}", "{city: Rome}"),
    ("empty string: as sent", "", ""),
    ("a parsed dict", {"b": 1, "a": 2}, '{"a":2,"b":1}'),
    ("None", None, "null"),
    ("a dict with a non-string key: str()", {1: 2}, "{1: 2}"),
    ("an object orjson cannot dump: str()", Unprintable(), "<unprintable>"),
]


@pytest.mark.parametrize(
    ("arguments", "expected"), [r[1:] for r in CANONICAL_ROWS], ids=[r[0] for r in CANONICAL_ROWS]
)
def test_canonical_arguments(arguments: Any, expected: str) -> None:
    assert canonical_arguments(arguments) == expected


TEXT_ROWS: list[tuple[str, Any, str]] = [
    ("string", "abc", "abc"),
    ("None", None, ""),
    ("a number", 5, ""),
    ("a mapping, not a list", {"text": "x"}, ""),
    ("string parts joined", ["a", "b"], "ab"),
    ("text parts joined", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "ab"),
    ("text without a type", [{"text": "a"}], "a"),
    ("an image: its kind", [{"type": "image_url", "image_url": {"url": "u"}}], "<image_url>"),
    ("non-string text: its kind", [{"type": "x", "text": 5}], "<x>"),
    ("non-string text, no type", [{"text": 5}], ""),
    ("empty type", [{"type": ""}], ""),
    ("other items skipped", [3, None, ["a"]], ""),
    ("mixed", ["a", {"text": "b"}, {"type": "input_image"}, 7], "ab<input_image>"),
]


@pytest.mark.parametrize(
    ("content", "expected"), [r[1:] for r in TEXT_ROWS], ids=[r[0] for r in TEXT_ROWS]
)
def test_text_of(content: Any, expected: str) -> None:
    assert text_of(content) == expected


# -- the adapters -----------------------------------------------------------------------------

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}

CHAT_ROWS: list[tuple[str, dict[str, Any], Encoded | None]] = [
    ("system", {"role": "system", "content": "s"}, None),
    ("developer", {"role": "developer", "content": "s"}, None),
    ("no role", {"content": "s"}, None),
    ("non-string role", {"role": 5, "content": "s"}, None),
    ("user", {"role": "user", "content": "hi"}, encode("user", "hi")),
    ("parts", {"role": "user", "content": [{"type": "text", "text": "hi"}]}, encode("user", "hi")),
    (
        "tool calls",
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        encode("assistant", "", [("f", '{"a":1}')]),
    ),
    (
        "tool_calls null",
        {"role": "assistant", "content": "x", "tool_calls": None},
        encode("assistant", "x"),
    ),
    (
        "two calls",
        {"role": "assistant", "tool_calls": [CALL, {"function": {"name": "g", "arguments": "{}"}}]},
        encode("assistant", "", [("f", '{"a":1}'), ("g", "{}")]),
    ),
    (
        "a non-object call and a call without a function object skipped",
        {"role": "assistant", "tool_calls": ["junk", {"function": "f"}, CALL]},
        encode("assistant", "", [("f", '{"a":1}')]),
    ),
    (
        "no name, null arguments",
        {"role": "assistant", "tool_calls": [{"function": {"name": None, "arguments": None}}]},
        encode("assistant", "", [("", "")]),
    ),
    (
        "missing name and arguments",
        {"role": "assistant", "tool_calls": [{"function": {}}]},
        (
            "assistant",
            b"assistant\x1f\x1f\x1f\x1f\x1e",
        ),
    ),
    (
        "tool reference",
        {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
        encode("tool", "21C", ref="call_1"),
    ),
    (
        "non-string tool reference",
        {"role": "tool", "tool_call_id": 5, "content": "x"},
        encode("tool", "x"),
    ),
]


@pytest.mark.parametrize(
    ("message", "expected"), [r[1:] for r in CHAT_ROWS], ids=[r[0] for r in CHAT_ROWS]
)
def test_chat_message(message: dict[str, Any], expected: Encoded | None) -> None:
    assert chat_message(message) == expected


def test_chat_request_keeps_conversation_messages_only() -> None:
    assert chat_request({}) is None
    assert chat_request({"messages": "hi"}) is None
    assert chat_request({"messages": []}) == []
    messages = ["junk", {"role": "system", "content": "s"}, {"role": "user", "content": "a"}, 3]
    assert chat_request({"messages": messages}) == [encode("user", "a")]


CHAT_ANSWER_ROWS: list[tuple[str, dict[str, Any], list[Encoded]]] = [
    ("no choices", {}, []),
    ("choices not a list", {"choices": "x"}, []),
    ("no choice", {"choices": []}, []),
    ("a non-object choice", {"choices": ["x"]}, []),
    ("no message", {"choices": [{"index": 0}]}, []),
    ("a non-object message", {"choices": [{"message": "x"}]}, []),
    ("a system message", {"choices": [{"message": {"role": "system", "content": "x"}}]}, []),
    (
        "the first choice only",
        {
            "choices": [
                {"message": {"role": "assistant", "content": "a"}},
                {"message": {"role": "assistant", "content": "b"}},
            ]
        },
        [encode("assistant", "a")],
    ),
]


@pytest.mark.parametrize(
    ("response", "expected"),
    [r[1:] for r in CHAT_ANSWER_ROWS],
    ids=[r[0] for r in CHAT_ANSWER_ROWS],
)
def test_chat_answer(response: dict[str, Any], expected: list[Encoded]) -> None:
    assert chat_answer(response) == expected


RESPONSES_ROWS: list[tuple[str, Any, Encoded | None]] = [
    ("a string", "hi", encode("user", "hi")),
    ("a number", 5, None),
    ("a message without a type", {"role": "user", "content": "hi"}, encode("user", "hi")),
    (
        "a typed message with parts",
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
        encode("assistant", "x"),
    ),
    ("a system message", {"type": "message", "role": "system", "content": "s"}, None),
    ("a developer message", {"role": "developer", "content": "s"}, None),
    ("a message without a role", {"type": "message", "content": "s"}, None),
    ("a non-string role", {"role": 1, "content": "s"}, None),
    (
        "a function call",
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": '{"b":1,"a":2}'},
        encode("assistant", "", [("f", '{"a":2,"b":1}')]),
    ),
    (
        "a function call without name or arguments",
        {"type": "function_call"},
        ("assistant", b"assistant\x1f\x1f\x1f\x1fnull\x1e"),
    ),
    (
        "a function call output",
        {"type": "function_call_output", "call_id": "c1", "output": "21C"},
        encode("tool", "21C", ref="c1"),
    ),
    (
        "an output without a call id",
        {"type": "function_call_output", "output": [{"type": "input_text", "text": "21C"}]},
        ("tool", b"tool\x1f21C\x1f\x1e"),
    ),
    ("reasoning", {"type": "reasoning", "summary": []}, None),
]


@pytest.mark.parametrize(
    ("item", "expected"), [r[1:] for r in RESPONSES_ROWS], ids=[r[0] for r in RESPONSES_ROWS]
)
def test_responses_item(item: Any, expected: Encoded | None) -> None:
    assert responses_item(item) == expected


RESPONSES_REQUEST_ROWS: list[tuple[str, dict[str, Any], list[Encoded] | None]] = [
    ("a stored chain", {"previous_response_id": "resp_1", "input": "x"}, None),
    ("a conversation object", {"conversation": "conv_1", "input": "x"}, None),
    (
        "an empty chain id is no chain",
        {"previous_response_id": "", "input": "x"},
        [encode("user", "x")],
    ),
    ("string input", {"input": "x"}, [encode("user", "x")]),
    ("no input", {}, None),
    ("non-list input", {"input": 5}, None),
    (
        "list input, other items dropped",
        {"input": ["a", {"type": "reasoning"}, {"role": "system", "content": "s"}, 3]},
        [encode("user", "a")],
    ),
]


@pytest.mark.parametrize(
    ("body", "expected"),
    [r[1:] for r in RESPONSES_REQUEST_ROWS],
    ids=[r[0] for r in RESPONSES_REQUEST_ROWS],
)
def test_responses_request(body: dict[str, Any], expected: list[Encoded] | None) -> None:
    assert responses_request(body) == expected


def test_responses_answer() -> None:
    assert responses_answer({}) == []
    assert responses_answer({"output": "x"}) == []
    output = [{"type": "reasoning"}, {"type": "message", "role": "assistant", "content": "a"}]
    assert responses_answer({"output": output}) == [encode("assistant", "a")]


USE = {"type": "tool_use", "id": "tu_1", "name": "f", "input": {"b": 1, "a": 2}}
RESULT = {"type": "tool_result", "tool_use_id": "tu_1", "content": "21C"}

ANTHROPIC_ROWS: list[tuple[str, dict[str, Any], Encoded | None]] = [
    ("no role", {"content": "x"}, None),
    ("a non-string role", {"role": 1, "content": "x"}, None),
    ("string content", {"role": "user", "content": "hi"}, encode("user", "hi")),
    ("no content", {"role": "assistant"}, ("assistant", b"assistant\x1f\x1f\x1e")),
    (
        "text blocks joined",
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
        encode("assistant", "ab"),
    ),
    (
        "a null text",
        {"role": "user", "content": [{"type": "text", "text": None}]},
        encode("user", ""),
    ),
    (
        "tool use",
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, USE]},
        encode("assistant", "ok", [("f", '{"a":2,"b":1}')]),
    ),
    (
        "tool use without name or input",
        {"role": "assistant", "content": [{"type": "tool_use"}]},
        ("assistant", b"assistant\x1f\x1f\x1f\x1f{}\x1e"),
    ),
    (
        "a user turn of tool results is a tool message",
        {"role": "user", "content": [RESULT]},
        encode("tool", "21C", ref="tu_1"),
    ),
    (
        "two results: refs joined",
        {"role": "user", "content": [RESULT, {**RESULT, "tool_use_id": "tu_2", "content": "9C"}]},
        ("tool", b"tool\x1f21C9C\x1ftu_1,tu_2\x1e"),
    ),
    (
        "a result without an id",
        {
            "role": "user",
            "content": [{"type": "tool_result", "content": [{"type": "text", "text": "x"}]}],
        },
        ("tool", b"tool\x1fx\x1f\x1e"),
    ),
    (
        "results beside a call stay a user turn",
        {"role": "user", "content": [RESULT, USE]},
        encode("user", "21C", [("f", '{"a":2,"b":1}')], "tu_1"),
    ),
    (
        "an assistant turn with a result stays assistant",
        {"role": "assistant", "content": [RESULT]},
        encode("assistant", "21C", ref="tu_1"),
    ),
    (
        "non-object and unknown blocks skipped",
        {"role": "user", "content": ["junk", {"type": "image"}, {"type": "text", "text": "x"}]},
        encode("user", "x"),
    ),
]


@pytest.mark.parametrize(
    ("message", "expected"), [r[1:] for r in ANTHROPIC_ROWS], ids=[r[0] for r in ANTHROPIC_ROWS]
)
def test_anthropic_message(message: dict[str, Any], expected: Encoded | None) -> None:
    assert anthropic_message(message) == expected


def test_anthropic_request_and_answer() -> None:
    assert anthropic_request({}) is None
    assert anthropic_request({"messages": "x"}) is None
    messages = ["junk", {"role": "user", "content": "a"}, {"content": "no role"}]
    assert anthropic_request({"messages": messages}) == [encode("user", "a")]
    assert anthropic_answer({"content": [{"type": "text", "text": "b"}]}) == [
        encode("assistant", "b")
    ]
    assert anthropic_answer({}) == [encode("assistant", "")]


# -- where a history's links cut it ----------------------------------------------------------


def digest(messages: list[Encoded], upto: int) -> str:
    # Written out, not through the module's own helpers: a link is the first 16 bytes of
    # the SHA-1 of the history's encoded messages, one after another.
    hasher = hashlib.sha1()
    for _role, data in messages[:upto]:
        hasher.update(data)
    return hasher.hexdigest()[:32]


# roles of the history; the prefix length the answer link (lookup) covers and the request link
# (asked) covers, None where there is none; the turn.
HISTORY_ROWS: list[tuple[str, int | None, int | None, int]] = [
    ("", None, None, 1),
    ("u", None, None, 1),
    ("u u", None, None, 1),
    ("u t", None, None, 1),
    ("u a", 2, 1, 2),
    ("u a u", 2, 1, 2),
    ("u a t", 2, 1, 2),
    ("u a u t", 2, 1, 2),
    ("u a a t t", 3, 1, 2),
    ("u a a", 3, 1, 2),
    ("u a u a u", 4, 3, 3),
    ("u a u a", 4, 3, 3),
    ("u a t a t", 4, 3, 3),
    ("u a u a a u", 5, 3, 3),
    ("a", 1, None, 2),
    ("a u", 1, None, 2),
    ("a a u", 2, None, 2),
    ("u u a u", 3, 2, 2),
    # Another role (chat's old `function`) between the answer and the new messages: the answer
    # link still cuts before the new ones, but no request ended where the answer began.
    ("u a f u", 3, None, 2),
    ("u a f", 3, None, 2),
]
ROLE = {"u": "user", "a": "assistant", "t": "tool", "f": "function"}


@pytest.mark.parametrize(
    ("roles", "lookup", "asked", "turn"), HISTORY_ROWS, ids=[r[0] or "empty" for r in HISTORY_ROWS]
)
def test_history_links_cut_at_the_previous_answer(
    roles: str, lookup: int | None, asked: int | None, turn: int
) -> None:
    messages = [encode(ROLE[r], f"m{i}") for i, r in enumerate(roles.split())]
    found = history(messages)
    assert found.lookup == (None if lookup is None else "c:" + digest(messages, lookup))
    assert found.asked == (None if asked is None else "q:" + digest(messages, asked))
    assert found.turn == turn
    everything = digest(messages, len(messages))
    assert digest_text(found.hasher) == everything
    assert found.request_link == "q:" + everything


@pytest.mark.parametrize(
    ("roles", "by_request"),
    [
        ("u", True),
        ("u a u", True),
        ("u a t", True),
        ("a u", True),
        ("u a f", True),
        ("u a", False),  # an assistant prefill: the answer continues it
        ("u a a", False),
        ("a", False),
    ],
)
def test_the_next_turn_asks_for_this_request_when_its_history_ends_asking(
    roles: str, by_request: bool
) -> None:
    """`continued_by_request` promises that the next turn (this history, an answer, a new
    message) looks this request's own link up as its `asked`: proxies rely on it to let an
    answer go before its own link is stored."""
    messages = [encode(ROLE[r], f"m{i}") for i, r in enumerate(roles.split())]
    found = history(messages)
    following = history([*messages, encode("assistant", "answer"), encode("user", "next")])
    assert found.continued_by_request is by_request
    assert (following.asked == found.request_link) is by_request


def test_answer_digest_extends_a_copy_of_the_history() -> None:
    messages = [encode("user", "a")]
    answer = [encode("assistant", "b"), encode("assistant", "", [("f", "{}")])]
    found = history(messages)
    assert answer_digest(found.hasher, answer) == "c:" + digest(messages + answer, 3)
    assert digest_text(found.hasher) == digest(messages, 1)  # the history's own is unchanged


def test_routes_without_a_wire_have_no_history_and_no_answer() -> None:
    body = {"messages": [{"role": "user", "content": "a"}], "input": "a"}
    assert request_history("embeddings", body) is None
    assert request_history("chat/completions", {"messages": []}) is None
    assert (
        request_history("chat/completions", {"messages": [{"role": "system", "content": "s"}]})
        is None
    )
    found = request_history("responses", body)
    assert found is not None
    assert digest_text(found.hasher) == digest([encode("user", "a")], 1)
    answer = {
        "content": [{"type": "text", "text": "b"}],
        "choices": [{"message": {"role": "assistant", "content": "c"}}],
    }
    assert list(iter_answer("embeddings", answer)) == []
    assert list(iter_answer("messages", answer)) == [encode("assistant", "b")]
    assert list(iter_answer("chat/completions", answer)) == [encode("assistant", "c")]
    assert list(iter_answer("responses", {"output": ["x"]})) == [encode("user", "x")]
