"""One row of the playbook's scorecard, as plain data: what every renderer reads."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    MET = "met"
    MISSED = "missed"
    NOT_ENOUGH = "not enough evidence"
    NOT_MEASURED = "not measured"


@dataclass(frozen=True, slots=True)
class ScorecardRow:
    """`check`: the playbook's words; `target`: the threshold in words. `primary` and
    `candidate`: each arm's figure in `unit` (None: none). `measure`: what the status
    judges, its `estimate` and 95% interval (`low`/`high`, None where unbounded or none).
    `reason`: why it is not measured or not yet decided, or how it was read; `source`:
    where in the report (or elsewhere) the figure comes from."""

    key: str
    check: str
    target: str
    unit: str
    primary: float | None
    candidate: float | None
    measure: str
    estimate: float | None
    low: float | None
    high: float | None
    status: Status
    reason: str = ""
    source: str = ""
