"""Compare turn N's prompt with what an append-only agent would have sent: turn N-1's prompt
plus the answer it got. The longest common prefix is what the engine's prefix cache can reuse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvmigrate.cachecheck.classify import Break, classify, common_prefix
from kvmigrate.cachecheck.render import Rendering, Segment

Tokenize = Callable[[str], Sequence[Any]]


def default_tokenize() -> Tokenize:
    """The emulator's approximate tokenizer (about 4 characters a token, no model download)."""
    from kvmigrate.emulator.tokens import tokenize

    return tokenize


class TokenCounter:
    """Token counts per segment text, memoised: turn N+1 repeats all of turn N's segments.

    Counting per segment assumes a token never spans two fields; chat templates put special
    tokens between messages, so this holds at message boundaries and nearly so inside."""

    def __init__(self, tokenize: Tokenize | None = None, max_entries: int = 100_000) -> None:
        self.tokenize = tokenize or default_tokenize()
        self._counts: dict[str, int] = {}
        self._max = max_entries

    def count(self, text: str) -> int:
        if not text:
            return 0
        count = self._counts.get(text)
        if count is None:
            count = len(self.tokenize(text))
            if len(self._counts) >= self._max:
                self._counts.clear()  # a plain reset keeps memory bounded on huge datasets
            self._counts[text] = count
        return count

    def total(self, segments: Sequence[Segment]) -> int:
        # Called on every turn's whole prompt, several times: the memo is read inline, as a
        # call to `count` per segment was most of the cost.
        counts = self._counts
        n = 0
        for segment in segments:
            count = counts.get(segment.text)
            n += self.count(segment.text) if count is None else count
        return n

    def common(self, a: str, b: str) -> int:
        """Tokens the two texts share at their start."""
        ta, tb = self.tokenize(a), self.tokenize(b)
        n = 0
        for x, y in zip(ta, tb, strict=False):
            if x != y:
                break
            n += 1
        return n


@dataclass(frozen=True, slots=True)
class TurnCheck:
    """One request compared with the previous turn plus its answer.

    `expected_*` is what an append-only agent would let the cache reuse; `reused_*` the part
    of it this request actually starts with."""

    conversation: str
    turn: int
    expected_tokens: int
    reused_tokens: int
    expected_chars: int
    reused_chars: int
    prompt_tokens: int
    brk: Break | None = None

    @property
    def ratio(self) -> float:
        return 1.0 if self.expected_tokens == 0 else self.reused_tokens / self.expected_tokens

    @property
    def tokens_lost(self) -> int:
        return self.expected_tokens - self.reused_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "conversation": self.conversation,
            "turn": self.turn,
            "reuse_ratio": round(self.ratio, 4),
            "expected_tokens": self.expected_tokens,
            "reused_tokens": self.reused_tokens,
            "tokens_lost": self.tokens_lost,
            "expected_chars": self.expected_chars,
            "reused_chars": self.reused_chars,
            "prompt_tokens": self.prompt_tokens,
            "break": self.brk.as_dict() if self.brk else None,
        }


def first_difference(expected: Sequence[Segment], actual: Sequence[Segment]) -> int:
    """Index of the first segment whose text differs (len(expected) when none does)."""
    for i, segment in enumerate(expected):
        if i >= len(actual) or actual[i].text != segment.text:
            return i
    return len(expected)


def compare(
    expected: Rendering,
    actual: Rendering,
    counter: TokenCounter,
    conversation: str = "",
    turn: int = 0,
) -> TurnCheck:
    old, new = expected.segments, actual.segments
    index = first_difference(old, new)
    prompt_tokens = counter.total(new)
    same = old[:index]
    chars, tokens = sum(len(s.text) for s in same), counter.total(same)
    if index == len(old):
        return TurnCheck(conversation, turn, tokens, tokens, chars, chars, prompt_tokens)
    if index == len(new):
        # The request is a prefix of the expected one: a retry or a regenerate of the last
        # turn. The engine can reuse all of it; nothing was broken.
        total = prompt_tokens
        return TurnCheck(conversation, turn, total, total, chars, chars, total)
    a, b = old[index].text, new[index].text
    reused_chars = chars + common_prefix(a, b)
    reused_tokens = tokens + counter.common(a, b)
    brk = classify(expected, actual, index, reused_chars)
    return TurnCheck(
        conversation,
        turn,
        counter.total(old),
        reused_tokens,
        sum(len(s.text) for s in old),
        reused_chars,
        prompt_tokens,
        brk,
    )
