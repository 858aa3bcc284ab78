"""Conversation keys are stored (pins in Redis, continuity links, records), so the same
request must get the same key from every release: a golden table of bodies for each wire
(chat, Responses, completions, embeddings) pins them, with the properties that make them
useful (later turns and a changed timestamp keep the key; a changed opening does not)."""

from __future__ import annotations

from typing import Any

import pytest

from kvmigrate.policies.conversation import (
    conversation_key,
    declared_key,
    is_derived_key,
    turn_index,
)

SYS: dict[str, Any] = {
    "role": "system",
    "content": "You are a coding agent. Current time: 2025-01-06 10:31:07",
}
DEV: dict[str, Any] = {"role": "developer", "content": "Answer in English."}
USER: dict[str, Any] = {"role": "user", "content": "Fix the failing test."}
PARTS: dict[str, Any] = {
    "role": "user",
    "content": [
        {"type": "text", "text": "Describe run_8f3a9c21e4"},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
    ],
}
BODIES: dict[str, dict[str, Any]] = {
    "chat": {"messages": [SYS, USER]},
    "chat, developer": {"messages": [DEV, USER]},
    "chat, system and developer": {"messages": [SYS, DEV, USER]},
    "chat, content parts": {"messages": [SYS, PARTS]},
    "chat, a non-object before the system": {"messages": ["junk", SYS, USER]},
    "chat, no user message": {"messages": [SYS]},
    "responses, input list": {"input": [DEV, USER]},
    "responses, input list and instructions": {
        "input": [USER],
        "instructions": "Be brief. 2025-01-06",
    },
    "responses, string input": {"input": "Fix the failing test.", "instructions": "Be brief."},
    # Anthropic's Messages API: the system prompt is a top-level string or list of blocks.
    "messages, system string": {"system": SYS["content"], "messages": [USER]},
    "messages, system blocks": {
        "system": [
            {"type": "text", "text": SYS["content"], "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [USER],
    },
    "completions": {"prompt": "def add(a, b):"},
    "embeddings": {"input": "the quick brown fox"},
    "nothing": {},
}
GOLDEN = {
    "chat": ("h:2d2a81be6a33b23ed24a0b44", "prefix"),
    "chat, developer": ("h:5d7b5ba4ba23163dddac6b61", "prefix"),
    "chat, system and developer": ("h:419416e1ab387ae1b7d25367", "prefix"),
    "chat, content parts": ("h:6a273fb1beb6ef8b6b77f535", "prefix"),
    "chat, a non-object before the system": ("h:2d2a81be6a33b23ed24a0b44", "prefix"),
    "chat, no user message": ("h:972c738d3d0839feb155be82", "prefix"),
    "responses, input list": ("h:5d7b5ba4ba23163dddac6b61", "prefix"),
    "responses, input list and instructions": ("h:3dd85c98b7114bcfda1da18c", "prefix"),
    # Changed on purpose in #17: a string input was keyed on instructions alone
    # (h:99d4ed6f3d2c0546d67da168), so every conversation sharing instructions was one.
    "responses, string input": ("h:01048dd1765c9eb0439ed9c3", "prefix"),
    # The same opening as "chat": one conversation, whichever wire it arrives on.
    "messages, system string": ("h:2d2a81be6a33b23ed24a0b44", "prefix"),
    "messages, system blocks": ("h:ba6c8769f602aa5a795f6adf", "prefix"),
    "completions": ("h:29a466ff7a2e853a083b3364", "body"),
    "embeddings": ("h:09ce02cd356baf2a835af432", "body"),
    "nothing": ("h:f765f749a6e04da3200158b0", "body"),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_keys_are_the_same_in_every_release(name: str) -> None:
    key = conversation_key({}, BODIES[name], "gpt-4o-mini")
    assert (key.value, key.source) == GOLDEN[name]


def later(body: dict[str, Any], key: str = "messages") -> dict[str, Any]:
    return {**body, key: [*body[key], {"role": "assistant", "content": "Done."}, USER]}


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        (BODIES["chat"], later(BODIES["chat"]), True),
        (BODIES["responses, input list"], later(BODIES["responses, input list"], "input"), True),
        # A new timestamp or id in the opening: still the same conversation.
        (
            BODIES["chat"],
            {
                "messages": [
                    {**SYS, "content": SYS["content"].replace("10:31:07", "11:45:00")},
                    USER,
                ]
            },
            True,
        ),
        (
            BODIES["chat, content parts"],
            {
                "messages": [
                    SYS,
                    {
                        **PARTS,
                        "content": [
                            {"type": "text", "text": "Describe run_77aa00bb11"},
                            PARTS["content"][1],
                        ],
                    },
                ]
            },
            True,
        ),
        (
            BODIES["responses, input list and instructions"],
            {
                **BODIES["responses, input list and instructions"],
                "instructions": "Be brief. 2025-02-07",
            },
            True,
        ),
        # A different opening: another conversation.
        (BODIES["chat"], {"messages": [SYS, {"role": "user", "content": "Another task."}]}, False),
        (
            BODIES["chat, developer"],
            {"messages": [{**DEV, "content": "Answer in French."}, USER]},
            False,
        ),
        (
            BODIES["chat, content parts"],
            {
                "messages": [
                    SYS,
                    {
                        **PARTS,
                        "content": [
                            PARTS["content"][0],
                            {"type": "image_url", "image_url": {"url": "https://x/z.png"}},
                        ],
                    },
                ]
            },
            False,
        ),
        (
            BODIES["responses, input list and instructions"],
            {**BODIES["responses, input list and instructions"], "instructions": "Be thorough."},
            False,
        ),
        (BODIES["completions"], {"prompt": "def sub(a, b):"}, False),
        (BODIES["embeddings"], {"input": "the lazy dog"}, False),
    ],
)
def test_what_keeps_a_conversation_together(
    first: dict[str, Any], second: dict[str, Any], same: bool
) -> None:
    a, b = (conversation_key({}, body, "gpt-4o-mini").value for body in (first, second))
    assert (a == b) is same


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({"x-session-id": "sess-1"}, {"user": "u1"}, ("sess-1", "header")),
        # Header bytes that are not UTF-8 reach us as lone surrogates: they become text.
        ({"x-session-id": "caf\udcc3\udca9"}, {}, ("café", "header")),
        ({"x-session-id": "bad\udcff"}, {}, ("bad\ufffd", "header")),
        ({"x-session-id": ""}, {"user": "u1"}, ("user:u1", "user")),
        ({}, {"user": "u1"}, ("user:u1", "user")),
        ({}, {"user": ""}, None),
        ({}, {"user": 7}, None),
        ({}, {}, None),
    ],
)
def test_declared_keys(
    headers: dict[str, str], body: dict[str, Any], expected: tuple[str, str] | None
) -> None:
    key = declared_key(headers, body)
    assert (None if key is None else (key.value, key.source)) == expected
    if key is not None:
        assert conversation_key(headers, {**body, **BODIES["chat"]}, "m") == key


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"user_id": "u2"}, "user:u2"),
        ({"user_id": ""}, None),  # an empty user_id declares nothing
        ({"user_id": 7}, None),
        ("u2", None),
    ],
)
def test_a_messages_request_declares_its_conversation_in_metadata_user_id(
    metadata: Any, expected: str | None
) -> None:
    key = declared_key({}, {"metadata": metadata}, "messages")
    assert (None if key is None else key.value) == expected


@pytest.mark.parametrize(
    ("body", "turn"),
    [
        ({"messages": [SYS, USER]}, 1),
        (later(BODIES["chat"]), 2),
        (later(later(BODIES["chat"])), 3),
        ({"messages": ["junk", {"role": "assistant", "content": "x"}, USER]}, 2),
        # A Responses input list counts the answers it resends (#17), as chat does.
        ({"input": [USER, {"role": "assistant", "content": "x"}]}, 2),
        ({"prompt": "x"}, 1),
    ],
)
def test_turn_index(body: dict[str, Any], turn: int) -> None:
    assert turn_index(body) == turn


@pytest.mark.parametrize(
    ("conversation", "derived"),
    [
        ("h:" + "0123456789abcdef01234567", True),
        ("h:" + "f" * 24, True),
        ("h:" + "f" * 23, False),  # one digit short
        ("h:" + "f" * 25, False),  # one too many
        ("h:" + "F" * 24, False),  # a digest is lower-case hex
        ("h:" + "g" * 24, False),
        ("x:" + "f" * 24, False),  # another prefix
        ("hh" + "f" * 24, False),
        ("f" * 26, False),
        ("alice@example.com", False),  # a declared session: it may name someone
        ("", False),
    ],
)
def test_is_derived_key_knows_only_the_digests_conversation_key_makes(
    conversation: str, derived: bool
) -> None:
    assert is_derived_key(conversation) is derived


def test_every_opening_digest_reads_as_derived() -> None:
    body = {"messages": [{"role": "user", "content": "Plan a day in Rome."}]}
    assert is_derived_key(conversation_key({}, body, "gpt-4o-mini").value)
