"""What every comparator reads: the request and both sides' answers, parsed once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kvmigrate.parity.answer import Answer, Outcome
from kvmigrate.parity.result import ComparatorResult
from kvmigrate.parity.settings import ParitySettings


@dataclass(frozen=True, slots=True)
class PairContext:
    request: Mapping[str, Any]
    primary: Outcome
    candidate: Outcome
    primary_answer: Answer
    candidate_answer: Answer
    settings: ParitySettings

    @property
    def texts(self) -> tuple[str, str]:
        return self.primary_answer.text, self.candidate_answer.text

    @property
    def text_pair(self) -> bool:
        """Both sides answered in text (or one side said nothing), with no tool calls:
        the pairs that text, length and topic comparisons make sense for."""
        p, c = self.primary_answer, self.candidate_answer
        if p.is_tool_answer or c.is_tool_answer:
            return False
        return bool(p.text.strip() or c.text.strip())


class Comparator(Protocol):
    """A comparator returns None when it does not apply to the pair."""

    def __call__(self, ctx: PairContext) -> ComparatorResult | None: ...
