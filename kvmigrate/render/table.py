"""A table of formatted cells, and its text, Markdown and HTML renderings: the report's
sections, the plan's and the benchmark's are all such tables."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvmigrate.html_text import escape
from kvmigrate.logtext import printable


@dataclass(frozen=True, slots=True)
class Table:
    key: str
    title: str
    headers: tuple[str, ...]
    rows: Sequence[tuple[str, ...]] = field(default_factory=list)
    note: str = ""  # shown instead of the table when it has no rows
    footnote: str = ""  # shown under the table: how to read it


def plain(text: str) -> str:
    """Recorded values (conversation ids, rollout reasons) may hold terminal escapes."""
    return printable(text, limit=10_000)


def text_table(table: Table) -> list[str]:
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(table.headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in table.rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return [plain(line) for line in lines]


_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#])")


def md_escape(text: str) -> str:
    """Text that Markdown and the HTML inside it show as written: a recorded `user`, a
    session id or a rollout reason like `<script>` or `[x](javascript:...)` stays text."""
    text = " ".join(printable(text, limit=10_000).splitlines())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def md_table(table: Table) -> list[str]:
    def cells(values: tuple[str, ...]) -> str:
        return "| " + " | ".join(map(md_escape, values)) + " |"

    return [cells(table.headers), "|" + "---|" * len(table.headers), *map(cells, table.rows)]


def html_table(table: Table) -> str:
    head = f"<h2>{escape(table.title)}</h2>"
    if not table.rows:
        return f'{head}<p class="note">{escape(table.note)}</p>'
    cells = "".join(f"<th>{escape(h)}</th>" for h in table.headers)
    rows = "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in table.rows
    )
    foot = (
        f'<p class="footnote" data-footnote="{escape(table.key)}">{escape(table.footnote)}</p>'
        if table.footnote
        else ""
    )
    return f'{head}<table data-table="{escape(table.key)}"><tr>{cells}</tr>{rows}</table>{foot}'
