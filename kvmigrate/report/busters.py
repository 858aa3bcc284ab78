"""The report's cache-buster section: what in the recorded prompts defeated prefix caching.

The live detector in the proxy only counts breaks into /metrics; the report runs the same
analysis (`kvmigrate.cachecheck`) over the recorded requests of its window, so the causes,
the fields and the fixes are in the document a team reads."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping

from kvmigrate.cachecheck import (
    Conversation,
    CostModel,
    Summary,
    TokenCounter,
    TurnCheck,
    check_conversation,
)
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report.buster_window import Window
from kvmigrate.report.model import BusterRow, CacheBusters

SHOWN = 10
BATCH_ROWS = 2_000  # records whose bodies are held at once (more only for one conversation)


def cache_busters(
    store: RecordStore, since: float, until: float, cohort_of: Mapping[str, str] | None = None
) -> tuple[CacheBusters, dict[str, CacheBusters]]:
    """The fleet's cache busters, and each cohort's when `cohort_of` (request id -> cohort)
    names more than one. Each cohort's conversations are checked once; the fleet adds them up."""
    fleet, own, cohorts = buster_summaries(store, since, until, cohort_of)
    if not own:
        return CacheBusters(checked=False), {}
    by_cohort = {name: _section(s) for name, s in own.items()} if cohorts > 1 else {}
    return _section(fleet), by_cohort


def buster_summaries(
    store: RecordStore, since: float, until: float, cohort_of: Mapping[str, str] | None = None
) -> tuple[Summary, dict[str, Summary], int]:
    """The fleet's summary, each cohort's with a conversation to check, and how many cohorts
    had a readable request. The same as `cachecheck.parse_lines` and `check_all` over the
    window's `recorded_requests`, cohort by cohort, but with a batch of conversations in
    memory at a time, not the window (kvmigrate.report.buster_window)."""
    window = Window.read(store, since, until, cohort_of or {}, BATCH_ROWS)
    fleet = Summary(CostModel())
    own: dict[str, Summary] = {}
    for cohort in sorted(window.groups):
        summary = Summary(CostModel())
        for checks in _in_order(window.conversations(cohort)):
            fleet.add(checks)
            summary.add(checks)
        if summary.conversations:
            own[cohort] = summary
    return fleet, own, len(window.found)


def _in_order(conversations: Iterable[tuple[int, int, Conversation]]) -> Iterator[list[TurnCheck]]:
    """Each conversation's checks, in the order `parse_lines` lists them: by their first
    readable request. Summary.add is order-sensitive (the example a buster shows is the
    first seen, ties rank in the order seen), and a conversation whose first records are
    unreadable comes later than its first record: those wait in a heap until no
    conversation yet to come can precede them."""
    waiting: list[tuple[int, list[TurnCheck]]] = []
    for bound, position, conversation in conversations:
        while waiting and waiting[0][0] < bound:
            yield heapq.heappop(waiting)[1]
        # A counter per conversation, as check_all: its memo holds this one's segments.
        checks = check_conversation(conversation, TokenCounter())
        heapq.heappush(waiting, (position, checks))
        del conversation  # its bodies are not kept while the next batch is read
    while waiting:
        yield heapq.heappop(waiting)[1]


def _section(summary: Summary) -> CacheBusters:
    breaks, lost = summary.lost(deliberate=False)
    rows = tuple(
        BusterRow(
            cls=b.cls.value,
            field=f"{b.role} {b.where}".strip(),
            label=b.label,
            breaks=b.breaks,
            conversations=len(b.conversations),
            tokens_lost=b.tokens_lost,
            deliberate=b.example.deliberate,
            fix=b.example.fix,
        )
        for b in summary.ranked()[:SHOWN]
    )
    return CacheBusters(
        checked=True,
        conversations=summary.conversations,
        compared=summary.compared,
        reuse_ratio=summary.reuse_ratio,
        breaks=breaks,
        tokens_lost=lost,
        busters=rows,
    )
