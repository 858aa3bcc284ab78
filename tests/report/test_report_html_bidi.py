"""Recorded values cannot reorder what the HTML pages show: Unicode's bidirectional
controls (U+202E reverses the rest of its line) in a conversation id, a rollout reason or a
model name are shown as visible escapes, as the text and Markdown reports show them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvmigrate.html_text import escape
from kvmigrate.recorder import Record, open_store
from kvmigrate.report import RENDERERS, TimelineEvent, build_report

RLO = "\u202e"  # right-to-left override


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (f"cost {RLO}001$", "cost \\u202e001$"),
        ("a\u2066b\u2069c\u200fd\u061ce", "a\\u2066b\\u2069c\\u200fd\\u061ce"),
        ('<b title="x">é, 日本, 🙂</b>', "&lt;b title=&quot;x&quot;&gt;é, 日本, 🙂&lt;/b&gt;"),
    ],
)
def test_escape_shows_bidi_controls_and_keeps_every_other_character(value: str, shown: str) -> None:
    assert escape(value) == shown


def test_the_html_report_shows_a_recorded_override_as_an_escape(tmp_path: Path) -> None:
    now = time.time()
    record = Record(
        "r1", now - 60, "chat/completions", "hosted", "serve", "m", "m",
        f"user:{RLO}evil", 1, False, 200, None, latency_ms=10.0,
    )  # fmt: skip
    events = [TimelineEvent(now - 30, "rollback", f"by ops {RLO}tnemmoc", 0.0)]
    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.insert([record])
        report = build_report(store, since=0, timeline=events)
    page = RENDERERS["html"](report)
    assert RLO not in page
    assert "\\u202etnemmoc" in page
