"""`kvmigrate rollout status` on a config of several cohorts: one line per cohort, and under
a cohort of several candidates, one line per candidate and one per pair of them."""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvmigrate.policies import Mode
from kvmigrate.policies.candidate_compare import PairDifference
from kvmigrate.policies.gates import Verdict, gate_summary
from kvmigrate.rollout.controller import CandidateGates, RolloutStatus

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
    lines = [_line(HEADER, widths)]
    for status, row in zip(statuses, rows[1:], strict=True):
        lines.append(_line(row, widths))
        if len(status.candidates) > 1:
            lines += ["  " + line for line in candidate_lines(status)]
    return "\n".join(lines)


def candidate_lines(status: RolloutStatus) -> list[str]:
    """Each candidate's gates for the next step (`*`: the one a split serves), then each
    pair of candidates compared, one line each."""
    lines = [_candidate(c, status.next_step) for c in status.candidates]
    pairs: dict[tuple[str, str], list[PairDifference]] = {}
    for d in status.comparisons:
        pairs.setdefault((d.a, d.b), []).append(d)
    for (a, b), differences in pairs.items():
        lines.append(f"{a} vs {b}: " + "; ".join(pair_summary(d) for d in differences))
    return lines


def pair_summary(d: PairDifference) -> str:
    """`error_rate fp8 better -1.20 pts [-1.9, -0.5]`, or `... undecided` with the interval
    (or what it still lacks)."""
    said = f"{d.measure} " + (f"{d.leader} better" if d.leader else "undecided")
    if d.estimate is None:
        return said + " (too little traffic)"
    unit = {"error_rate": (100, " pts", ".2f"), "ttft_p50": (1, " ms", ".0f")}
    scale, suffix, spec = unit.get(d.measure, (1, "", ".3f"))

    def text(value: float | None) -> str:
        return "unbounded" if value is None else f"{value * scale:+{spec}}"

    return said + f" {text(d.estimate)}{suffix} [{text(d.low)}, {text(d.high)}]"


def _candidate(candidate: CandidateGates, step: float | None) -> str:
    name = f"* {candidate.backend} (selected)" if candidate.serving else f"  {candidate.backend}"
    if step is None:
        return f"{name}: complete"
    return f"{name} for {step:g}%: " + gate_summary([g.to_dict() for g in candidate.gates])


def _line(row: tuple[str, ...], widths: list[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()


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
