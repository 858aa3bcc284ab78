"""The report by cohort: each cohort's own report, every section on its traffic alone, under
the fleet-wide one.

A record made before cohorts has none; it belongs to its model's own cohort, so the rows
carry `queries.record_cohort` (see rows.fetch_rows), and so does everything grouped here."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from kvmigrate.report.model import TimelineEvent
from kvmigrate.report.rows import Row


def split_by_cohort(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """The rows of each cohort, in name order; one entry when the traffic is one cohort (the
    fleet-wide report says it all then)."""
    by_cohort: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_cohort[row.cohort].append(row)
    return dict(sorted(by_cohort.items()))


def cohort_timeline(timeline: Sequence[TimelineEvent], cohort: str) -> list[TimelineEvent]:
    """The cohort's own changes, and those to the fleet-wide default it followed until its
    own first change (a store written before cohorts holds only those)."""
    own = min((e.ts for e in timeline if e.cohort == cohort), default=math.inf)
    return [e for e in timeline if e.cohort == cohort or (e.cohort == "" and e.ts < own)]


def cohort_candidate(candidates_of: Mapping[str, Sequence[str]], cohort: str, default: str) -> str:
    """The candidate a cohort's report holds against the primary: the first of its model's
    `candidates` (what a split promotes unless told otherwise), else the fleet's."""
    named = candidates_of.get(cohort, ())
    return named[0] if named else default


def outside_cohorts(rows: Sequence[Row], cohorts: Mapping[str, Sequence[Row]]) -> list[str]:
    """A note for the traffic no cohort's view holds (models without a rollout)."""
    outside = sorted({r.cohort for r in rows} - set(cohorts))
    if not outside:
        return []
    calls = sum(r.cohort in outside for r in rows)
    names = ", ".join(f"`{name}`" for name in outside)
    return [f"{calls:,} calls of models without a rollout ({names}) count in the fleet only."]
