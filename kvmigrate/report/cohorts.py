"""The report by cohort: each cohort's figures per backend, under the fleet-wide headline.

A record made before cohorts has none; it belongs to its model's own cohort, so the rows
carry `COALESCE(cohort, model)` (see rows.fetch_rows)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from kvmigrate.report import fmt
from kvmigrate.report.aggregate import backend_summaries
from kvmigrate.report.model import CohortSummary
from kvmigrate.report.rows import Row

HEADERS = (
    "cohort",
    "backend",
    "serve",
    "shadow",
    "conversations",
    "errors",
    "error rate",
    "TTFT p50",
    "TTFT p95",
    "latency p95",
)


def cohort_summaries(rows: Sequence[Row], order: Sequence[str]) -> list[CohortSummary]:
    """Per cohort, in name order; empty when all the traffic is one cohort (the fleet-wide
    headline says it all then)."""
    by_cohort: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_cohort[row.cohort or ""].append(row)
    if len(by_cohort) < 2:
        return []
    return [
        CohortSummary(name, backend_summaries(cohort_rows, order))
        for name, cohort_rows in sorted(by_cohort.items())
    ]


def cohort_rows(cohorts: Sequence[CohortSummary]) -> list[tuple[str, ...]]:
    return [
        (
            c.cohort or "-",
            b.backend,
            fmt.number(b.serve),
            fmt.number(b.shadow),
            fmt.number(b.conversations),
            fmt.number(b.errors),
            fmt.pct(b.error_rate),
            fmt.ms(b.ttft_p50_ms),
            fmt.ms(b.ttft_p95_ms),
            fmt.ms(b.latency_p95_ms),
        )
        for c in cohorts
        for b in c.backends
    ]
