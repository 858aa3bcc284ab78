"""Plain-text and Markdown renderings of a report."""

from __future__ import annotations

from kvmigrate.render.table import md_escape, md_table, plain, text_table
from kvmigrate.report.model import Report
from kvmigrate.report.tables import cohort_lines, report_tables, summary_lines

TITLE = "kvmigrate report"


def render_text(report: Report) -> str:
    """The fleet first; then, when the traffic is several cohorts, each cohort's sections."""
    out = [TITLE, "=" * len(TITLE), *map(plain, summary_lines(report)), ""]
    out += _text_sections(report)
    for cohort in report.cohorts:
        head = f"Cohort {cohort.cohort}"
        out += [plain(head), "=" * len(plain(head)), *map(plain, cohort_lines(cohort)), ""]
        out += _text_sections(cohort)
    return "\n".join(out)


def _text_sections(report: Report) -> list[str]:
    out = []
    for table in report_tables(report):
        out += [plain(table.title), "-" * len(plain(table.title))]
        out += text_table(table) if table.rows else [plain(table.note)]
        if table.rows and table.footnote:
            out.append(plain(table.footnote))
        out.append("")
    return out


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
