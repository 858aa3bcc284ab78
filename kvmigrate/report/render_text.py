"""Plain-text and Markdown renderings of a report."""

from __future__ import annotations

import re

from kvmigrate.logtext import printable
from kvmigrate.report.model import Report
from kvmigrate.report.tables import Table, cohort_lines, report_tables, summary_lines

TITLE = "kvmigrate report"


def render_text(report: Report) -> str:
    """The fleet first; then, when the traffic is several cohorts, each cohort's sections."""
    out = [TITLE, "=" * len(TITLE), *map(_plain, summary_lines(report)), ""]
    out += _text_sections(report)
    for cohort in report.cohorts:
        head = f"Cohort {cohort.cohort}"
        out += [_plain(head), "=" * len(_plain(head)), *map(_plain, cohort_lines(cohort)), ""]
        out += _text_sections(cohort)
    return "\n".join(out)


def _text_sections(report: Report) -> list[str]:
    out = []
    for table in report_tables(report):
        out += [_plain(table.title), "-" * len(_plain(table.title))]
        out += text_table(table) if table.rows else [_plain(table.note)]
        if table.rows and table.footnote:
            out.append(_plain(table.footnote))
        out.append("")
    return out


def _plain(text: str) -> str:
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
    return [_plain(line) for line in lines]


def render_md(report: Report) -> str:
    out = [f"# {TITLE}", ""]
    out += [f"- {md_escape(line)}" for line in summary_lines(report)]
    out.append("")
    out += _md_sections(report, "##")
    for cohort in report.cohorts:
        out += [f"## Cohort {md_escape(cohort.cohort)}", ""]
        out += [f"- {md_escape(line)}" for line in cohort_lines(cohort)]
        out.append("")
        out += _md_sections(cohort, "###")
    return "\n".join(out)


def _md_sections(report: Report, level: str) -> list[str]:
    out = []
    for table in report_tables(report):
        out += [f"{level} {md_escape(table.title)}", ""]
        out += md_table(table) if table.rows else [f"_{md_escape(table.note)}_"]
        if table.rows and table.footnote:
            out += ["", f"_{md_escape(table.footnote)}_"]
        out.append("")
    return out


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
