"""The report's "Slowest conversations" section (report.evaluate), as table cells."""

from __future__ import annotations

from kvmigrate.render import fmt
from kvmigrate.report.evaluate import MIN_TURNS, SlowConversations
from kvmigrate.report.users_table import Section

HEADERS = (
    "conversation",
    "backend",
    "turns",
    "waited",
    "TTFT p50",
    "last TTFT",
    "prompt tokens (cached)",
    "cost",
    "caching would save",
)


def slow_section(slow: SlowConversations) -> Section:
    title = f"Slowest conversations ({MIN_TURNS}+ turns)"
    note = f"No conversation of {MIN_TURNS} or more turns in this window."
    rows = [
        (
            c.conversation[:18],
            c.backend,
            str(c.turns),
            fmt.ms(c.waited_ms),
            fmt.ms(c.ttft_p50_ms),
            fmt.ms(c.last_ttft_ms),
            f"{c.prompt_tokens:,} ({c.cached_tokens:,})",
            fmt.usd(c.cost_usd),
            f"{fmt.usd(c.saving_usd)} ({c.cacheable_tokens:,} tokens)",
        )
        for c in slow.slowest
    ]
    footnote = (
        f"{slow.long_conversations:,} of {slow.conversations:,} conversations had "
        f"{MIN_TURNS}+ turns: together {fmt.usd(slow.cost_usd)} at the hosted prices, of "
        f"which a prefix cache would have saved {fmt.usd(slow.saving_usd)} (each turn's "
        "resent prompt and answer not already billed as cached, at the input minus the "
        "cached-input price; what busts the cache, below, lowers it). Waited: the sum of "
        "the turns' latencies."
    )
    return Section(title, HEADERS, rows, note, footnote)
