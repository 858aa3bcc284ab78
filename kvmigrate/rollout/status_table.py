"""`kvmigrate rollout status` on a config of several cohorts: one line per cohort."""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvmigrate.policies import Mode
from kvmigrate.policies.gates import Verdict
from kvmigrate.rollout.controller import RolloutStatus

HEADER = ("COHORT", "MODE", "PERCENT", "CANDIDATE", "LAST CHANGE", "NEXT STEP")


def next_step_summary(status: RolloutStatus) -> str:
    """What the next step's gates say, in a few words: `50%: passed`, or the gates that
    hold it back and why (`50%: traffic waiting, error_rate FAILED`)."""
    if status.next_step is None:
        return "complete"
    held = [g for g in status.gates_for_next_step if g.verdict != Verdict.PASSED]
    if not held:
        return f"{status.next_step:g}%: gates pass"
    words = {Verdict.FAILED: "FAILED", Verdict.INCONCLUSIVE: "waiting"}
    return f"{status.next_step:g}%: " + ", ".join(
        f"{g.name} {words.get(g.verdict, str(g.verdict))}" for g in held
    )


def render_status_table(statuses: Sequence[RolloutStatus]) -> str:
    rows = [HEADER] + [_row(s) for s in statuses]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _row(status: RolloutStatus) -> tuple[str, ...]:
    state = status.state
    percent = state.percent if state.mode == Mode.SPLIT else 0.0
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.updated_at))
        if state.updated_at
        else "-"
    )
    changed = f"{when} by {state.updated_by}" if state.updated_by else when
    return (
        status.cohort or "(fleet)",
        str(state.mode),
        f"{percent:g}%",
        status.candidate or "-",
        changed,
        next_step_summary(status),
    )
