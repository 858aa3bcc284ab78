"""`kvmigrate report`: aggregate recorded traffic, render it as text, md, json or html."""

from kvmigrate.report.build import build_report
from kvmigrate.report.model import Prices, Report, TimelineEvent
from kvmigrate.report.render_html import render_html
from kvmigrate.report.render_json import render_json, report_dict
from kvmigrate.report.render_text import render_md, render_text

RENDERERS = {"text": render_text, "md": render_md, "json": render_json, "html": render_html}

__all__ = [
    "RENDERERS",
    "Prices",
    "Report",
    "TimelineEvent",
    "build_report",
    "render_html",
    "render_json",
    "render_md",
    "render_text",
    "report_dict",
]
