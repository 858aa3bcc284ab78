"""A conversation read from the records shares one object per stored message across its
turns; the check renders each message once then (render.SegmentMemo). Rendered with the
memo or without, shared or not, every turn renders and checks the same."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from cachecheck_support import CLEAN, PLANTED, Agent, agent, tool

from kvmigrate.cachecheck import Conversation, TokenCounter, Turn, check_conversation
from kvmigrate.cachecheck.render import SegmentMemo, render_request

CASES = [(case[0], case[1]) for case in PLANTED] + CLEAN


def _shared(conversation: Conversation) -> Conversation:
    """The conversation as recorder.history.inflate_rows returns it: equal messages are one
    object across turns; each request's other members (its tools) are its own."""
    seen: dict[bytes, Any] = {}
    turns = []
    for turn in conversation.turns:
        body = json.loads(json.dumps(turn.request))
        body["messages"] = [seen.setdefault(orjson.dumps(m), m) for m in body["messages"]]
        turns.append(Turn(body, turn.response))
    return Conversation(conversation.id, turns)


@pytest.mark.parametrize(("name", "spec"), CASES, ids=[name for name, _ in CASES])
def test_a_memo_renders_every_turn_as_a_fresh_rendering(name: str, spec: Agent) -> None:
    memo = SegmentMemo()
    for turn in _shared(agent(name, spec)).turns:
        assert render_request(turn.request, memo) == render_request(turn.request)


@pytest.mark.parametrize(("name", "spec"), CASES, ids=[name for name, _ in CASES])
def test_shared_messages_check_as_separate_copies(name: str, spec: Agent) -> None:
    conversation = agent(name, spec)
    shared = check_conversation(_shared(conversation), TokenCounter())
    assert shared == check_conversation(conversation, TokenCounter())


def test_tools_that_orjson_cannot_tell_apart_are_rendered_anew() -> None:
    """NaN and None both write as null; a memo keyed on that text would mix them up."""
    memo = SegmentMemo()
    nan = {"model": "m", "messages": [], "tools": [tool("read_file") | {"x": float("nan")}]}
    none = {"model": "m", "messages": [], "tools": [tool("read_file") | {"x": None}]}
    assert render_request(nan, memo) == render_request(nan)
    assert render_request(none, memo) == render_request(none)
    assert render_request(none, memo) != render_request(nan, memo)
