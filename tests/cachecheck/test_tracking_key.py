"""Which key the detector tracks a turn under: the conversation's own, unless the proxy's
key for it is a hash that this turn's system prompt made."""

from __future__ import annotations

from typing import Any

import pytest

from kvmigrate.cachecheck.tracker import tracking_key

DERIVED = "h:" + "ab" * 12


def _request(system: str, first_user: str = "Begin.") -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first_user}]
    return {"model": "gpt-4o-mini", "messages": messages}


@pytest.mark.parametrize(
    ("conversation", "identity", "kept"),
    [
        ("session-7", "header", True),  # declared: the client's own key
        ("user:42", "user", True),
        (DERIVED, "opening", True),  # the key every later turn is found under
        (DERIVED, "continuity", True),  # carried over from the opening, whatever the prompt
        (DERIVED, "guess", False),  # made from this turn's own (maybe changed) prompt
        (DERIVED, "", False),  # how it was known is not said
    ],
)
def test_the_conversation_key_is_kept_unless_this_turns_prompt_made_it(
    conversation: str, identity: str, kept: bool
) -> None:
    key = tracking_key(conversation, _request("You are terse."), identity)
    assert (key == conversation) is kept
    assert key.startswith("c:") is not kept


def test_a_turn_keyed_by_its_prompt_is_tracked_by_model_and_first_user_message() -> None:
    """A guessed turn is found however its system prompt changed; then two agents with one
    opening message share that key (the price of a guess, not of every turn)."""
    one = tracking_key(DERIVED, _request("Now: 10:01. You are terse."), "guess")
    two = tracking_key("h:" + "cd" * 12, _request("Now: 10:02. You are terse."), "guess")
    other = tracking_key(DERIVED, _request("You are terse.", "Hello."), "guess")
    assert one == two != other
