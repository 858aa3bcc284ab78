"""Parity per candidate, when a model has several (`models[].candidates`): each candidate's
scored copies against the primary, with the same primary-vs-primary noise floor, side by
side so the candidates can be compared with each other."""

from __future__ import annotations

from collections.abc import Sequence

from kvmigrate.exchange import Role
from kvmigrate.parity.recording import NOISE_KIND
from kvmigrate.render import fmt
from kvmigrate.report.model import ParitySummary
from kvmigrate.report.parity import parity_summary
from kvmigrate.report.rows import Row

HEADERS = ("candidate", "scored pairs", "noise-adjusted parity", "mean pair score", "tool calls")


def parity_by_candidate(rows: Sequence[Row]) -> dict[str, ParitySummary]:
    """Per candidate backend with scored copies; empty unless there are two or more."""
    noise = [r for r in rows if r.parity_kind == NOISE_KIND]
    scored_by: dict[str, list[Row]] = {}
    for row in rows:
        if (
            row.role == Role.SHADOW
            and row.parity_kind is not None
            and row.parity_kind != NOISE_KIND
        ):
            scored_by.setdefault(row.backend, []).append(row)
    if len(scored_by) < 2:
        return {}
    return {b: parity_summary([*own, *noise]) for b, own in sorted(scored_by.items())}


def candidate_rows(by_candidate: dict[str, ParitySummary]) -> list[tuple[str, ...]]:
    return [
        (
            backend,
            fmt.number(s.samples),
            fmt.pct(s.noise_adjusted)
            if s.noise_adjusted is not None
            else f"inconclusive ({s.noise_pairs} noise pairs)",
            fmt.pct(s.mean),
            fmt.pct(s.tool_agreement),
        )
        for backend, s in by_candidate.items()
    ]
