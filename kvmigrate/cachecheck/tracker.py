"""Follow conversations one request at a time (the online path): each request is compared
with the fingerprint its conversation left, then leaves its own for the next turn."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from kvmigrate.cachecheck.breakpoints import with_breakpoint
from kvmigrate.cachecheck.compare import TokenCounter, Tokenize, TurnCheck, compare
from kvmigrate.cachecheck.fingerprint import Fingerprint, FingerprintStore
from kvmigrate.cachecheck.messages_view import breakpoint_message
from kvmigrate.cachecheck.render import Rendering, answer_message, content_text, render_request


class ConversationTracker:
    def __init__(self, store: FingerprintStore, tokenize: Tokenize | None = None) -> None:
        self.store = store
        self.counter = TokenCounter(tokenize, max_entries=20_000)

    def observe(
        self,
        key: str,
        request: Mapping[str, Any],
        response: Mapping[str, Any] | None,
        now: float,
        turn: int = 0,
    ) -> TurnCheck:
        actual = render_request(request)
        hashes = [hash(s.text) for s in actual.segments]
        previous = None if _is_first_turn(request) else self.store.get(key, now)
        check, tokens = self._check(key, turn, actual, hashes, previous)
        mark = breakpoint_message(request)
        if previous is not None:
            check = with_breakpoint(check, previous.breakpoint, mark, actual, self.counter)
        answer = answer_message(response)
        expected = actual.extended([answer]) if answer is not None else actual
        tokens += [self.counter.count(s.text) for s in expected.segments[len(tokens) :]]
        self.store.put(key, Fingerprint.of(expected, tokens, now, mark))
        return check

    def _check(
        self,
        key: str,
        turn: int,
        actual: Rendering,
        hashes: list[int],
        previous: Fingerprint | None,
    ) -> tuple[TurnCheck, list[int]]:
        """The check, and the token counts of the request's segments (reused when known)."""
        if previous is not None:
            n = len(previous.hashes)
            if hashes[:n] == previous.hashes.tolist():
                # Append-only: no text to open, no token to recount for the shared part.
                tokens = previous.tokens.tolist()
                tokens += [self.counter.count(s.text) for s in actual.segments[n:]]
                reused = sum(previous.tokens)
                chars = sum(len(s.text) for s in actual.segments[:n])
                return TurnCheck(key, turn, reused, reused, chars, chars, sum(tokens)), tokens
            check = compare(previous.rendering(), actual, self.counter, key, turn)
        else:
            tokens = [self.counter.count(s.text) for s in actual.segments]
            check = TurnCheck(key, turn, 0, 0, 0, 0, sum(tokens))
            return check, tokens
        return check, [self.counter.count(s.text) for s in actual.segments]


def _is_first_turn(request: Mapping[str, Any]) -> bool:
    """No answer resent yet: a new conversation, even under a reused key (a `user` id)."""
    messages = request.get("messages")
    return not isinstance(messages, list) or not any(
        isinstance(m, Mapping) and m.get("role") == "assistant" for m in messages
    )


# How the proxy knew a conversation when its derived key (`h:`) stays the same whatever its
# system prompt does: its opening, and every later turn found by continuity of its history.
STABLE_IDENTITIES = frozenset({"opening", "continuity"})


def tracking_key(conversation: str, request: Mapping[str, Any], identity: str = "") -> str:
    """The proxy's conversation key, unless it is a hash of the opening (`h:`) that this
    turn's own system prompt made (`identity` "guess", or unknown): that key changes with
    the very system prompt we look for changes in, so such turns are keyed by their model
    and first user message instead. A key that conversation identity carried over from the
    opening is the conversation's own: keyed by the first user message, two agents that
    differ only in their system prompt would be checked against each other."""
    if not conversation.startswith("h:") or identity in STABLE_IDENTITIES:
        return conversation
    messages = request.get("messages")
    first = next(
        (
            m
            for m in (messages if isinstance(messages, list) else [])
            if isinstance(m, Mapping) and m.get("role") == "user"
        ),
        {},
    )
    seed = orjson.dumps([request.get("model"), content_text(first.get("content"))])
    return "c:" + hashlib.blake2b(seed, digest_size=12).hexdigest()
