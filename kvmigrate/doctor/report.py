"""A diagnosis as text (one line per check, the fix under each failure) and as JSON."""

from __future__ import annotations

from typing import Any

from kvmigrate.doctor.checks import Diagnosis

_MARK = {"pass": "ok  ", "fail": "FAIL", "warn": "warn", "skip": "skip"}


def text(diagnosis: Diagnosis) -> str:
    lines = [f"kvmigrate doctor: {diagnosis.base_url} (model: {diagnosis.model or '?'})"]
    width = max((len(c.name) for c in diagnosis.checks), default=0)
    for check in diagnosis.checks:
        optional = "" if check.required else " (optional)"
        lines.append(
            f"  {_MARK[check.status]}  {check.name.ljust(width)}  {check.detail}{optional}"
        )
        if check.fix and check.status in ("fail", "warn"):
            lines.append(f"        fix: {check.fix}")
    failed = diagnosis.failed_required
    if failed:
        names = ", ".join(c.name for c in failed)
        lines.append(f"{len(failed)} required check(s) failed: {names}")
    else:
        lines.append("all required checks passed")
    return "\n".join(lines)


def as_json(diagnosis: Diagnosis) -> dict[str, Any]:
    return {
        "base_url": diagnosis.base_url,
        "model": diagnosis.model,
        "ok": diagnosis.ok,
        "checks": [
            {
                "name": c.name,
                "status": c.status,
                "required": c.required,
                "detail": c.detail,
                "fix": c.fix,
            }
            for c in diagnosis.checks
        ],
    }
