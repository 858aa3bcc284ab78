"""One section of the report as formatted cells: what the text, md and html views print."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Table:
    key: str
    title: str
    headers: tuple[str, ...]
    rows: Sequence[tuple[str, ...]] = field(default_factory=list)
    note: str = ""  # shown instead of the table when it has no rows
    footnote: str = ""  # shown under the table: how to read it
