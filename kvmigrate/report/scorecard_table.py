"""The scorecard as a table, and `kvmigrate report --scorecard`'s page in every format."""

from __future__ import annotations

from kvmigrate.render import fmt
from kvmigrate.render.table import Table
from kvmigrate.report.model import Report
from kvmigrate.report.scorecard_model import ScorecardRow
from kvmigrate.report.speed_tables import span

HEADERS = ("check", "target", "primary", "candidate", "judged", "95% CI", "status", "why")
TITLE = "Scorecard (the playbook's checklist)"
FOOT = (
    "Status from the interval: met when all of it is on the target's side, missed when all "
    "of it is beyond, not enough evidence when it straddles the target or rests on too few "
    "calls, not measured when there is no figure (the reason says why)."
)


def value(v: float | None, unit: str) -> str:
    if v is None:
        return fmt.MISSING
    if unit == "ms":
        return fmt.ms(v)
    if unit == "tok/s":
        return f"{fmt.number(v, 1)} tok/s"
    if unit == "share":
        return fmt.pct(v)
    if unit == "$/1M tokens":
        return f"{fmt.usd(v)}/1M"
    return fmt.number(v, 2)


# Rows whose judged figure is a share (0..1) whatever the unit of the arms' figures.
SHARE_JUDGED = frozenset({"ttft_improvement", "gpu"})


def _judged(row: ScorecardRow) -> tuple[str, str]:
    """The judged figure and its interval, as cells."""
    if row.estimate is None:
        return fmt.MISSING, fmt.MISSING
    if row.key in SHARE_JUDGED:
        ci = span(*(None if b is None else b * 100 for b in (row.low, row.high)))
        no_ci = row.low is None and row.high is None
        return fmt.pct(row.estimate), "none given" if no_ci else f"{ci} %"
    if row.low is None and row.high is None:
        return value(row.estimate, row.unit), "none given"
    return value(row.estimate, row.unit), span(row.low, row.high)


def scorecard_table(report: Report) -> Table:
    rows = []
    for r in report.scorecard:
        judged, ci = _judged(r)
        rows.append(
            (
                r.check,
                r.target,
                value(r.primary, r.unit),
                value(r.candidate, r.unit),
                judged,
                ci,
                str(r.status),
                r.reason,
            )
        )
    return Table("scorecard", TITLE, HEADERS, rows, "No scorecard for this view.", FOOT)
