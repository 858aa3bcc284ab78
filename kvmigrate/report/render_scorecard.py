"""`kvmigrate report --scorecard`: the scorecard alone, as text, md, json or html."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from kvmigrate.html_text import escape
from kvmigrate.render import fmt
from kvmigrate.render.json_values import finite
from kvmigrate.render.page import STYLE
from kvmigrate.render.table import html_table, md_escape, md_table, text_table
from kvmigrate.report.model import Report
from kvmigrate.report.scorecard_table import FOOT, TITLE, scorecard_table


def _lines(report: Report) -> list[str]:
    return [
        f"Window: {fmt.when(report.since)} .. {fmt.when(report.until)}",
        f"Primary: {report.primary}   Candidate: {report.candidate}",
    ]


def scorecard_text(report: Report) -> str:
    out = [TITLE, "=" * len(TITLE), *_lines(report), ""]
    return "\n".join([*out, *text_table(scorecard_table(report)), "", FOOT]) + "\n"


def scorecard_md(report: Report) -> str:
    out = [f"# {md_escape(TITLE)}", "", *(f"- {md_escape(line)}" for line in _lines(report))]
    return "\n".join([*out, "", *md_table(scorecard_table(report)), "", f"_{md_escape(FOOT)}_", ""])


def scorecard_dict(report: Report) -> dict[str, Any]:
    data = {
        "since": report.since,
        "until": report.until,
        "primary": report.primary,
        "candidate": report.candidate,
        "scorecard": [dataclasses.asdict(r) for r in report.scorecard],
    }
    return finite(data)  # type: ignore[no-any-return]


def scorecard_json(report: Report) -> str:
    return orjson.dumps(scorecard_dict(report), option=orjson.OPT_INDENT_2).decode() + "\n"


def scorecard_html(report: Report) -> str:
    items = "".join(f"<li>{escape(line)}</li>" for line in _lines(report))
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{escape(TITLE)}</title><style>{STYLE}</style></head><body>",
            f"<h1>{escape(TITLE)}</h1>",
            f'<ul class="summary">{items}</ul>',
            html_table(scorecard_table(report)),
            f'<p class="footnote">{escape(FOOT)}</p>',
            "</body></html>",
        ]
    )


SCORECARD_RENDERERS = {
    "text": scorecard_text,
    "md": scorecard_md,
    "json": scorecard_json,
    "html": scorecard_html,
}
