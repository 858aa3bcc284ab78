"""Anthropic's `cache_control` breakpoints from one turn to the next.

Hosted Anthropic caches a prompt only up to a breakpoint, and a later request reads the
cache only where one of its own breakpoints (or the 20 blocks before one) lands on a cached
prefix. A breakpoint that moves forward every turn keeps the whole history cached; one
that moves back, or disappears, leaves the history after it to be read at full price on
every turn, though the prompt itself is append-only. A self-hosted engine caches every
prefix regardless: the tokens counted lost are those hosted Anthropic re-reads at full
price, which the fix names as a hosted-only cost.
"""

from __future__ import annotations

from dataclasses import replace

from kvmigrate.cachecheck.classes import BreakClass, fix_for
from kvmigrate.cachecheck.classify import Break, Location
from kvmigrate.cachecheck.compare import TokenCounter, TurnCheck
from kvmigrate.cachecheck.render import TOOLS, Rendering

_NONE = TOOLS - 1  # below every message and the tools: "no breakpoint"


def with_breakpoint(
    check: TurnCheck,
    previous: int | None,
    current: int | None,
    actual: Rendering,
    counter: TokenCounter,
) -> TurnCheck:
    """`check` of an otherwise unbroken turn, with the break when the last breakpoint went
    from rendered message `previous` back to `current` (None: the request marks none)."""
    if check.brk is not None or previous is None:
        return check
    now = _NONE if current is None else current
    if now >= previous:
        return check
    uncached = [s for s in actual.segments if now < s.message <= previous]
    tokens = min(sum(counter.count(s.text) for s in uncached), check.reused_tokens)
    brk = _break(previous, current, now, actual, tokens)
    return replace(check, reused_tokens=check.reused_tokens - tokens, brk=brk)


def _break(previous: int, current: int | None, now: int, actual: Rendering, tokens: int) -> Break:
    char = sum(len(s.text) for s in actual.segments if s.message <= now)
    role = next((s.role for s in actual.segments if s.message == now), "system")
    where = _where(current)
    cls = BreakClass.CACHE_BREAKPOINT
    return Break(
        cls,
        Location(None if current in (None, TOOLS) else current, role, "cache_control", 0, char),
        f"breakpoint after {_where(previous)}",
        f"breakpoint {where}" if current is not None else "no breakpoint",
        fix_for(cls, "", role, "cache_control"),
        detail=(
            f"the last cache_control moved from {_where(previous)} to {where}: hosted "
            f"Anthropic reads {tokens} tokens after it at full price"
        ),
    )


def _where(index: int | None) -> str:
    if index is None:
        return "nowhere"
    return "the tools" if index == TOOLS else f"message {index}"
