"""What a feedback request may say, checked before anything is stored.

The shape follows Langfuse's and LangSmith's scores: a `name` (Langfuse's `name`,
LangSmith's `key`), a numeric `value` (LangSmith's `score`), an optional `comment`, and
what it scores: a conversation (Langfuse's `sessionId`, LangSmith's `trace_id`: the
proxy's `X-Session-ID` or the request's `user`) or one answer (Langfuse's
`observationId`, LangSmith's `run_id`: the id of a chat completion, a Responses answer or
a Messages answer). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The body's limit: a score and a short comment, not a transcript.
MAX_BODY_BYTES = 16 * 1024
MAX_ID_CHARS = 512
MAX_NAME_CHARS = 64
# A comment is redacted like a prompt, then cut to this.
MAX_COMMENT_CHARS = 1000
# Scores are ratings (1-5, 0-10, thumbs as +1/-1, a share): one far outside any of them is a
# mistake or ballot stuffing, and a mean over values near the float limit is infinite.
MAX_ABS_VALUE = 1_000_000.0
DEFAULT_NAME = "satisfaction"
FIELDS = frozenset({"conversation_id", "response_id", "name", "value", "comment"})


class FeedbackUnavailable(Exception):
    """The records database cannot take a score now (locked, down, full, or a backlog of
    scores already waiting for it): the client may try again."""


class FeedbackError(ValueError):
    """A feedback body that cannot be stored: `param` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Feedback:
    """One score, as the client gave it (ids not yet hashed, comment not yet redacted)."""

    name: str
    value: float
    conversation_id: str | None = None
    response_id: str | None = None
    comment: str | None = None


def parse_feedback(data: Any) -> Feedback:
    """The feedback a decoded JSON body gives, or FeedbackError saying what is wrong."""
    if not isinstance(data, Mapping):
        raise FeedbackError("The feedback body must be a JSON object.")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise FeedbackError(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
    conversation = _identifier(data, "conversation_id")
    response = _identifier(data, "response_id")
    if conversation is None and response is None:
        raise FeedbackError(
            "Name what the score is for: `conversation_id` (the X-Session-ID the "
            "conversation was sent with, or `user:` and its `user`) or `response_id` (the "
            "`id` of an answer).",
            "conversation_id",
        )
    return Feedback(
        name=_name(data.get("name", DEFAULT_NAME)),
        value=_value(data.get("value")),
        conversation_id=conversation,
        response_id=response,
        comment=_comment(data.get("comment")),
    )


def _identifier(data: Mapping[str, Any], field: str) -> str | None:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise FeedbackError(f"`{field}` must be a string.", field)
    if not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        raise FeedbackError(f"`{field}` must be 1 to {MAX_ID_CHARS} printable characters.", field)
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str):
        raise FeedbackError("`name` must be a string.", "name")
    if not value or len(value) > MAX_NAME_CHARS or not value.isprintable():
        raise FeedbackError(f"`name` must be 1 to {MAX_NAME_CHARS} printable characters.", "name")
    return value


def _value(value: Any) -> float:
    # A bool is an int to Python, and no score.
    if value is None:
        raise FeedbackError("`value` is required: the score, a number.", "value")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FeedbackError("`value` must be a number.", "value")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not math.isfinite(number):
        raise FeedbackError("`value` must be a finite number.", "value")
    if abs(number) > MAX_ABS_VALUE:
        raise FeedbackError(
            f"`value` must be from {-MAX_ABS_VALUE:,.0f} to {MAX_ABS_VALUE:,.0f}.", "value"
        )
    return number


def _comment(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise FeedbackError("`comment` must be a string.", "comment")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, from a `\ud800` escape
        raise FeedbackError(
            "`comment` must be text: it holds a lone surrogate.", "comment"
        ) from None
    return value
