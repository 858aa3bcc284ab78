"""Check whole conversations turn by turn (the offline path: datasets, exports, tests)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.cachecheck.breakpoints import with_breakpoint
from kvmigrate.cachecheck.compare import TokenCounter, Tokenize, TurnCheck, compare
from kvmigrate.cachecheck.messages_view import breakpoint_message, view_messages
from kvmigrate.cachecheck.render import Rendering, SegmentMemo, answer_message, render_request


@dataclass(frozen=True, slots=True)
class Turn:
    request: Mapping[str, Any]
    response: Mapping[str, Any] | None = None  # the answer; None: read it from the next turn


@dataclass(slots=True)
class Conversation:
    id: str
    turns: list[Turn] = field(default_factory=list)


def check_conversation(conversation: Conversation, counter: TokenCounter) -> list[TurnCheck]:
    """One TurnCheck per turn; the first turn has nothing to reuse (expected 0)."""
    checks: list[TurnCheck] = []
    previous: Rendering | None = None
    previous_turn: Turn | None = None
    # Each turn resends the history before it: rendered once per message, not per turn.
    memo = SegmentMemo()
    mark: int | None = None  # the previous turn's breakpoint, found when it was current
    for number, turn in enumerate(conversation.turns, start=1):
        actual = render_request(turn.request, memo)
        if previous is None or previous_turn is None:
            tokens = counter.total(actual.segments)
            checks.append(TurnCheck(conversation.id, number, 0, 0, 0, 0, tokens))
            mark = breakpoint_message(turn.request)
        else:
            expected = _expected(previous, previous_turn, turn)
            check = compare(expected, actual, counter, conversation.id, number)
            marks = mark, breakpoint_message(turn.request)
            checks.append(with_breakpoint(check, *marks, actual, counter))
            mark = marks[1]
        previous, previous_turn = actual, turn
    return checks


def check_all(
    conversations: Iterable[Conversation], tokenize: Tokenize | None = None
) -> Iterator[tuple[Conversation, list[TurnCheck]]]:
    for conversation in conversations:
        # A counter per conversation: its memo holds this conversation's segments only.
        yield conversation, check_conversation(conversation, TokenCounter(tokenize))


def _expected(previous: Rendering, previous_turn: Turn, turn: Turn) -> Rendering:
    """The previous prompt plus the answer it got. Without a recorded answer, the assistant
    message this turn carries where the answer belongs stands in for it."""
    answer = answer_message(previous_turn.response)
    if answer is None:
        messages = view_messages(turn.request)
        at = previous.messages
        if isinstance(messages, list) and at < len(messages):
            candidate = messages[at]
            if isinstance(candidate, Mapping) and candidate.get("role") == "assistant":
                answer = dict(candidate)
    return previous.extended([answer]) if answer is not None else previous
