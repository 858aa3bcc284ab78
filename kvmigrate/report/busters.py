"""The report's cache-buster section: what in the recorded prompts defeated prefix caching.

The live detector in the proxy only counts breaks into /metrics; the report runs the same
analysis (`kvmigrate.cachecheck`) over the recorded requests of its window, so the causes,
the fields and the fixes are in the document a team reads."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import orjson

from kvmigrate.cachecheck import CostModel, DatasetError, Summary, check_all, parse_lines
from kvmigrate.cachecheck.checker import CHECKED_ROUTES
from kvmigrate.recorder.export import recorded_requests
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report.model import BusterRow, CacheBusters

SHOWN = 10


def cache_busters(
    store: RecordStore, since: float, until: float, cohort_of: Mapping[str, str] | None = None
) -> tuple[CacheBusters, dict[str, CacheBusters]]:
    """The fleet's cache busters, and each cohort's when `cohort_of` (request id -> cohort)
    names more than one. Each cohort's conversations are checked once; the fleet adds them up."""
    cohort_of = cohort_of or {}
    found: dict[str, list[str]] = defaultdict(list)
    for line in recorded_requests(store, since, until, CHECKED_ROUTES):
        found[cohort_of.get(str(line["custom_id"]), "")].append(orjson.dumps(line).decode())
    fleet = Summary(CostModel())
    own: dict[str, Summary] = {}
    for cohort, lines in sorted(found.items()):
        try:
            data = parse_lines(lines, "records")
        except DatasetError:
            continue
        own[cohort] = Summary(CostModel())
        for _conversation, checks in check_all(data.conversations):
            fleet.add(checks)
            own[cohort].add(checks)
    if not own:
        return CacheBusters(checked=False), {}
    by_cohort = {name: _section(s) for name, s in own.items()} if len(found) > 1 else {}
    return _section(fleet), by_cohort


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
