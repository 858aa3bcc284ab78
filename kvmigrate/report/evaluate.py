"""The playbook's evaluate phase: the slowest long conversations, their cost, and what
prefix caching would save on them.

A conversation of `MIN_TURNS` or more served turns is ranked by the time its user waited
(the sum of its turns' latencies). Its cost is priced with the report's hosted price table
(`Prices`, as `report.cost` prices the month). What prefix caching would save: each turn
resends the previous turn's prompt and answer, so that much of its prompt could be read
from a prefix cache; the tokens of it the provider did not already bill as cached, priced
at the difference between the input and the cached-input price. It assumes nothing busts
the prefix: the report's cache-buster section names what does, and `kvmigrate plan`
what a self-hosted prefix cache does to latency.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvmigrate.exchange import Role
from kvmigrate.percentile import percentile
from kvmigrate.report.rows import Row

if TYPE_CHECKING:  # report.model holds these figures: no import of it as this loads
    from kvmigrate.report.model import Prices

MIN_TURNS = 5
SHOWN = 10


@dataclass(frozen=True, slots=True)
class SlowConversation:
    conversation: str  # as records keep it (a keyed hash or a prefix digest)
    backend: str
    turns: int
    waited_ms: float  # the sum of its turns' latencies
    ttft_p50_ms: float | None
    last_ttft_ms: float | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float
    cacheable_tokens: int  # resent prefix tokens not billed as cached
    saving_usd: float  # what a prefix cache would have saved on them


@dataclass(frozen=True, slots=True)
class SlowConversations:
    long_conversations: int = 0  # with MIN_TURNS+ turns
    conversations: int = 0
    slowest: tuple[SlowConversation, ...] = ()
    cost_usd: float = 0.0  # of all long conversations
    saving_usd: float = 0.0


def slow_conversations(rows: Sequence[Row], prices: Prices) -> SlowConversations:
    turns: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row.role == Role.SERVE and row.status is not None and row.status < 400:
            turns[row.conversation].append(row)
    long = [
        _figures(key, sorted(served, key=lambda r: (r.turn, r.ts)), prices)
        for key, served in turns.items()
        if len({r.turn for r in served}) >= MIN_TURNS
    ]
    long.sort(key=lambda c: (-c.waited_ms, c.conversation))
    return SlowConversations(
        long_conversations=len(long),
        conversations=len(turns),
        slowest=tuple(long[:SHOWN]),
        cost_usd=sum(c.cost_usd for c in long),
        saving_usd=sum(c.saving_usd for c in long),
    )


def _figures(key: str, served: list[Row], prices: Prices) -> SlowConversation:
    prompt = sum(r.prompt_tokens or 0 for r in served)
    cached = sum(min(r.cached_tokens or 0, r.prompt_tokens or 0) for r in served)
    output = sum(r.completion_tokens or 0 for r in served)
    cost = (
        (prompt - cached) * prices.input_per_m
        + cached * prices.cached_input_per_m
        + output * prices.output_per_m
    ) / 1e6
    cacheable = 0
    for before, turn in itertools.pairwise(served):
        resent = (before.prompt_tokens or 0) + (before.completion_tokens or 0)
        prefix = min(turn.prompt_tokens or 0, resent)
        cacheable += max(0, prefix - (turn.cached_tokens or 0))
    ttfts = [r.ttft_ms for r in served if r.ttft_ms is not None]
    return SlowConversation(
        conversation=key,
        backend=served[0].backend,
        turns=len({r.turn for r in served}),
        waited_ms=sum(r.latency_ms or 0.0 for r in served),
        ttft_p50_ms=percentile(ttfts, 50),
        last_ttft_ms=served[-1].ttft_ms,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=output,
        cost_usd=cost,
        cacheable_tokens=cacheable,
        saving_usd=cacheable * (prices.input_per_m - prices.cached_input_per_m) / 1e6,
    )
