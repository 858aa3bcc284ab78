"""Recorded values are data, not markup, in the Markdown report (issue 21 item 11)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from kvmigrate.recorder import Record, open_store
from kvmigrate.report import RENDERERS, TimelineEvent, build_report

HOSTILE = "<script>alert(1)</script>"
LINK = "[click](javascript:alert(2))"


def _record(n: int, role: str, backend: str, pair: str | None = None) -> Record:
    return Record(
        f"r{n}",
        time.time() - 60 + n,
        "chat/completions",
        backend,
        role,
        "m",
        "m",
        f"user:{HOSTILE}",
        1,
        False,
        200,
        None,
        latency_ms=10.0,
        pair_id=pair,
        parity_kind="candidate" if pair else None,
        parity_score=0.1 if pair else None,
    )


def test_markdown_escapes_conversation_ids_reasons_and_actors(tmp_path: Path) -> None:
    events = [TimelineEvent(time.time() - 30, "rollback", f"by {HOSTILE} because {LINK}", 0.0)]
    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.insert([_record(1, "serve", "hosted"), _record(2, "shadow", "vllm", "r1")])
        report = build_report(store, since=0, timeline=events)
    md = RENDERERS["md"](report)
    assert "alert(1)" in md  # the values are shown ...
    assert "<script>" not in md  # ... as text
    assert re.search(r"(?<!\\)\]\(javascript:", md) is None  # no live link
    text = RENDERERS["text"](build_report(None, since=0, timeline=events))
    assert "\x1b" not in text
