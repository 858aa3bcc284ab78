"""Answers without a record: what the proxies counted they answered (recorder.tally)
against the records they wrote, over the report's window.

It covers the proxy processes that count (record.durability `spool` or `fsync`), from the
start of the minute the window starts in: the counts are per minute. An answer of the
last seconds may still be on its way from a proxy's spool to the records, and shows as
missing until it lands. A process killed outright (kill -9, OOM) had its spool written by
the next start, which notes the crash: the answers of its last moments, not yet spooled,
are counted nowhere, and the report says how many processes ended so."""

from __future__ import annotations

from dataclasses import dataclass

from kvmigrate.exchange import Role
from kvmigrate.recorder.store import RecordStore
from kvmigrate.recorder.tally import bucket_of


@dataclass(frozen=True, slots=True)
class Completeness:
    """`counted`: some proxy counted its answers in this window. `answered`, `recorded`,
    `missing`: client answers (role serve); `copies_*`: shadow copies and noise calls."""

    counted: bool = False
    answered: int = 0
    recorded: int = 0
    missing: int = 0
    copies_answered: int = 0
    copies_recorded: int = 0
    copies_missing: int = 0
    unclean_stops: int = 0


def completeness(store: RecordStore, since: float, until: float) -> Completeness:
    start = bucket_of(since)
    answered = _by_role(
        store.query(
            "SELECT role, SUM(answers) FROM answered WHERE bucket >= ? AND bucket < ? "
            "GROUP BY role",
            (start, until),
        )
    )
    stops = store.query(
        "SELECT count(*) FROM unclean_stops WHERE ts >= ? AND ts < ?", (since, until)
    )
    unclean = int(stops[0][0]) if stops else 0
    if not answered:
        return Completeness(unclean_stops=unclean)
    recorded = _by_role(
        store.query(
            "SELECT role, count(*) FROM records WHERE ts >= ? AND ts < ? AND source IN "
            "(SELECT DISTINCT source FROM answered WHERE bucket >= ? AND bucket < ?) "
            "GROUP BY role",
            (start, until, start, until),
        )
    )
    serve = Role.SERVE.value
    copies = [role for role in answered.keys() | recorded.keys() if role != serve]
    a, r = answered.get(serve, 0), recorded.get(serve, 0)
    ca = sum(answered.get(role, 0) for role in copies)
    cr = sum(recorded.get(role, 0) for role in copies)
    return Completeness(
        counted=True,
        answered=a,
        recorded=r,
        missing=max(0, a - r),
        copies_answered=ca,
        copies_recorded=cr,
        copies_missing=max(0, ca - cr),
        unclean_stops=unclean,
    )


def _by_role(rows: list[tuple[object, ...]]) -> dict[str, int]:
    return {str(role): int(str(count)) for role, count in rows if count is not None}


def completeness_lines(c: Completeness) -> list[str]:
    """What the report's summary says of it: nothing when no proxy counted."""
    lines = []
    if c.counted:
        line = f"Answers recorded: {c.recorded:,} of the {c.answered:,} the proxies counted"
        if c.missing:
            line += (
                f"; {c.missing:,} answers without a record (dropped or lost: see "
                "kvmigrate_records_dropped_total; the last seconds' may still be on their way)"
            )
        lines.append(line)
        if c.copies_missing:
            lines.append(
                f"Shadow and noise copies recorded: {c.copies_recorded:,} of "
                f"{c.copies_answered:,} ({c.copies_missing:,} without a record)"
            )
    if c.unclean_stops:
        lines.append(
            f"{c.unclean_stops} proxy process(es) ended without a clean stop (kill -9, OOM, a "
            "crash): their spools were written back, but the answers of their last moments, "
            "not yet spooled, are counted nowhere"
        )
    return lines
