"""Plain-text and Markdown renderings of a report."""

from __future__ import annotations

from kvmigrate.report.model import Report
from kvmigrate.report.tables import Table, report_tables, summary_lines

TITLE = "kvmigrate report"


def render_text(report: Report) -> str:
    out = [TITLE, "=" * len(TITLE), *summary_lines(report), ""]
    for table in report_tables(report):
        out += [table.title, "-" * len(table.title)]
        out += _text_table(table) if table.rows else [table.note]
        out.append("")
    return "\n".join(out)


def _text_table(table: Table) -> list[str]:
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(table.headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in table.rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return lines


def render_md(report: Report) -> str:
    out = [f"# {TITLE}", ""]
    out += [f"- {line}" for line in summary_lines(report)]
    out.append("")
    for table in report_tables(report):
        out += [f"## {table.title}", ""]
        out += _md_table(table) if table.rows else [f"_{table.note}_"]
        out.append("")
    return "\n".join(out)


def _md_table(table: Table) -> list[str]:
    def cells(values: tuple[str, ...]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|").replace("\n", " ") for v in values) + " |"

    return [cells(table.headers), "|" + "---|" * len(table.headers), *map(cells, table.rows)]
