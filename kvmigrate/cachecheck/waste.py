"""What the breaks cost: tokens re-prefilled, the TTFT that takes, and its price."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.cachecheck.classes import DESCRIPTIONS, BreakClass
from kvmigrate.cachecheck.classify import Break
from kvmigrate.cachecheck.compare import TurnCheck

# Prefill throughput of an 8B model on one H200: the planner's reference engine
# (kvmigrate.plan.cost_model), a default, not a figure of this machine.
DEFAULT_PREFILL_TOKENS_PER_S = 31_000.0


@dataclass(frozen=True, slots=True)
class CostModel:
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    price_per_mtok: float | None = None  # $ per 1M input tokens that should have been cached

    def seconds(self, tokens: int) -> float:
        return tokens / self.prefill_tokens_per_s

    def dollars(self, tokens: int) -> float | None:
        return None if self.price_per_mtok is None else tokens * self.price_per_mtok / 1e6


@dataclass(slots=True)
class Buster:
    """One cause of breaks (class, where, label) across all the conversations it hit."""

    cls: BreakClass
    role: str
    where: str
    label: str
    example: Break
    breaks: int = 0
    tokens_lost: int = 0
    conversations: set[str] = field(default_factory=set)

    def as_dict(self, cost: CostModel) -> dict[str, Any]:
        return {
            "class": self.cls.value,
            "description": DESCRIPTIONS[self.cls],
            "deliberate": self.example.deliberate,
            "role": self.role,
            "field": self.where,
            "label": self.label,
            "breaks": self.breaks,
            "conversations": len(self.conversations),
            "tokens_lost": self.tokens_lost,
            "ttft_wasted_s": round(cost.seconds(self.tokens_lost), 4),
            "cost_wasted": _money(cost.dollars(self.tokens_lost)),
            "example": {
                "message": self.example.location.message,
                "offset": self.example.location.offset,
                "before": self.example.before,
                "after": self.example.after,
            },
            "fix": self.example.fix,
        }


@dataclass(slots=True)
class Summary:
    cost: CostModel
    conversations: int = 0
    requests: int = 0
    compared: int = 0  # requests after the first of their conversation
    expected_tokens: int = 0
    reused_tokens: int = 0
    by_turn: dict[int, list[float]] = field(default_factory=dict)
    busters: dict[tuple[str, str, str, str], Buster] = field(default_factory=dict)

    def add(self, checks: Iterable[TurnCheck]) -> None:
        self.conversations += 1
        for check in checks:
            self.requests += 1
            if check.turn == 1:
                continue
            self.compared += 1
            self.expected_tokens += check.expected_tokens
            self.reused_tokens += check.reused_tokens
            self.by_turn.setdefault(check.turn, []).append(check.ratio)
            if check.brk is not None:
                self._add_break(check, check.brk)

    def _add_break(self, check: TurnCheck, brk: Break) -> None:
        where = re.sub(r"\[\d+\]", "[]", brk.location.field)
        key = (brk.cls.value, brk.location.role, where, brk.label)
        buster = self.busters.get(key)
        if buster is None:
            buster = Buster(brk.cls, brk.location.role, where, brk.label, brk)
            self.busters[key] = buster
        buster.breaks += 1
        buster.tokens_lost += check.tokens_lost
        buster.conversations.add(check.conversation)

    def ranked(self) -> list[Buster]:
        return sorted(self.busters.values(), key=lambda b: (-b.tokens_lost, -b.breaks))

    @property
    def reuse_ratio(self) -> float:
        return 1.0 if self.expected_tokens == 0 else self.reused_tokens / self.expected_tokens

    def lost(self, deliberate: bool) -> tuple[int, int]:
        """(breaks, tokens lost) of the bugs, or of the deliberate truncations."""
        picked = [b for b in self.busters.values() if b.example.deliberate == deliberate]
        return sum(b.breaks for b in picked), sum(b.tokens_lost for b in picked)

    def as_dict(self) -> dict[str, Any]:
        breaks, lost = self.lost(False)
        deliberate, deliberate_lost = self.lost(True)
        return {
            "conversations": self.conversations,
            "requests": self.requests,
            "compared": self.compared,
            "reuse_ratio": round(self.reuse_ratio, 4),
            "expected_tokens": self.expected_tokens,
            "reused_tokens": self.reused_tokens,
            "reuse_by_turn": {
                str(t): {"requests": len(r), "mean_reuse": round(sum(r) / len(r), 4)}
                for t, r in sorted(self.by_turn.items())
            },
            "busters": [b.as_dict(self.cost) for b in self.ranked()],
            "waste": {
                "breaks": breaks,
                "tokens_lost": lost,
                "ttft_wasted_s": round(self.cost.seconds(lost), 4),
                "ttft_wasted_per_break_ms": round(1000 * self.cost.seconds(lost) / breaks, 2)
                if breaks
                else 0.0,
                "cost_wasted": _money(self.cost.dollars(lost)),
                "deliberate_breaks": deliberate,
                "deliberate_tokens_lost": deliberate_lost,
                "prefill_tokens_per_s": self.cost.prefill_tokens_per_s,
                "price_per_mtok": self.cost.price_per_mtok,
            },
        }


def _money(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
