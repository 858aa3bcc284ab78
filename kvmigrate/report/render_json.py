"""The report as JSON, for CI: every missing figure is null, never NaN."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import orjson

from kvmigrate.report.model import Report


def report_dict(report: Report) -> dict[str, Any]:
    data = dataclasses.asdict(report)
    for backend, summary in zip(data["backends"], report.backends, strict=True):
        backend["requests"] = summary.requests
    for cohort, summaries in zip(data["cohorts"], report.cohorts, strict=True):
        for backend, summary in zip(cohort["backends"], summaries.backends, strict=True):
            backend["requests"] = summary.requests
    data["empty"] = report.empty
    return _finite(data)  # type: ignore[no-any-return]


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def render_json(report: Report) -> str:
    return orjson.dumps(report_dict(report), option=orjson.OPT_INDENT_2).decode() + "\n"
