"""The report's cache-buster section: what in the recorded prompts defeated prefix caching.

The live detector in the proxy only counts breaks into /metrics; the report runs the same
analysis (`kvmigrate.cachecheck`) over the recorded requests of its window, so the causes,
the fields and the fixes are in the document a team reads."""

from __future__ import annotations

import orjson

from kvmigrate.cachecheck import CostModel, DatasetError, Summary, check_all, parse_lines
from kvmigrate.cachecheck.checker import CHECKED_ROUTES
from kvmigrate.recorder.export import recorded_requests
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report.model import BusterRow, CacheBusters

SHOWN = 10


def cache_busters(store: RecordStore, since: float, until: float) -> CacheBusters:
    found = recorded_requests(store, since, until, CHECKED_ROUTES)
    lines = (orjson.dumps(line).decode() for line in found)
    try:
        data = parse_lines(lines, "records")
    except DatasetError:
        return CacheBusters(checked=False)
    summary = Summary(CostModel())
    for _conversation, checks in check_all(data.conversations):
        summary.add(checks)
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
