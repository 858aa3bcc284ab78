"""How conversations were identified, and whether any look split across backends.

A conversation is a key's run of turns from a turn 1: two conversations that share an opening
(same system prompt and first question, no session id) share a key, which keeps them on one
warm backend, yet each starts with its own turn 1, so they count as two.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kvmigrate.exchange import Role
from kvmigrate.report.rows import Row

# Sources that rest on a guess: a later turn matched no remembered answer (`guess`), or a
# request without messages was keyed by its whole body.
WEAK = frozenset({"guess"})
WEAK_SHARE = 0.05  # a warning above this share of later turns
EXAMPLES = 3


@dataclass(frozen=True, slots=True)
class IdentitySummary:
    served: int = 0  # served requests with a recorded identity source
    shares: tuple[tuple[str, int], ...] = ()  # (source, served requests), largest first
    later_turns: int = 0  # served requests after turn 1
    weak: int = 0  # of those, keyed by a guess
    conversations: int = 0
    split: int = 0  # conversations whose turns were served by more than one backend
    split_examples: tuple[str, ...] = ()


def count_conversations(rows: Sequence[Row]) -> int:
    """Each key counts once per turn 1 it saw (at least once)."""
    starts: Counter[str] = Counter()
    for row in rows:
        starts[row.conversation] += row.turn <= 1
    return sum(max(1, n) for n in starts.values())


def identity_summary(rows: Sequence[Row]) -> IdentitySummary:
    served = [r for r in rows if r.role == Role.SERVE]
    sources = Counter(r.identity for r in served if r.identity)
    later = [r for r in served if r.turn > 1 and r.identity]
    backends: dict[str, set[str]] = defaultdict(set)
    for row in served:
        if row.status == 200 and row.fallback_from is None:
            backends[row.conversation].add(row.backend)
    split = sorted(key for key, seen in backends.items() if len(seen) > 1)
    return IdentitySummary(
        served=sum(sources.values()),
        shares=tuple(sources.most_common()),
        later_turns=len(later),
        weak=sum(r.identity in WEAK for r in later),
        conversations=count_conversations(served),
        split=len(split),
        split_examples=tuple(split[:EXAMPLES]),
    )


def identity_notes(summary: IdentitySummary) -> list[str]:
    notes = []
    if summary.split:
        examples = ", ".join(f"`{k}`" for k in summary.split_examples)
        notes.append(
            f"Warning: {summary.split:,} conversation(s) were served by more than one backend "
            f"(e.g. {examples}): they lose their prefix cache and switch models mid-chat. "
            "Send an `X-Session-ID` header per conversation."
        )
    if summary.later_turns and summary.weak / summary.later_turns > WEAK_SHARE:
        notes.append(
            f"Warning: {summary.weak:,} of {summary.later_turns:,} later turns matched no "
            "earlier answer and were keyed by a guess (their masked opening): conversations "
            "may be split or merged. Send an `X-Session-ID` header per conversation."
        )
    return notes
