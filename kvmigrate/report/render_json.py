"""The report as JSON, for CI: every missing figure is null, never NaN."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from kvmigrate.render.json_values import finite
from kvmigrate.report.model import Report

# What a cohort's report shares with the fleet's: said once, at the top.
SHARED = ("generated_at", "since", "until", "database", "cohorts")


def report_dict(report: Report) -> dict[str, Any]:
    """The fleet's figures, and under `cohorts` each cohort's, section by section."""
    data = _sections(report)
    data["cohorts"] = [
        {k: v for k, v in _sections(c).items() if k not in SHARED} for c in report.cohorts
    ]
    return finite(data)  # type: ignore[no-any-return]


def _sections(report: Report) -> dict[str, Any]:
    data = dataclasses.asdict(dataclasses.replace(report, cohorts=[]))
    for backend, summary in zip(data["backends"], report.backends, strict=True):
        backend["requests"] = summary.requests
    data["empty"] = report.empty
    return data


def render_json(report: Report) -> str:
    return orjson.dumps(report_dict(report), option=orjson.OPT_INDENT_2).decode() + "\n"
