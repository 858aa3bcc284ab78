"""One check's outcome: what every check (`checks`, `responses_chain`) returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["pass", "fail", "warn", "skip"]


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    status: Status
    required: bool
    detail: str
    fix: str = ""
