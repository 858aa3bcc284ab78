"""Feedback on PostgreSQL as on SQLite: the migration, the sink's write, and the report's
join of a score to the arm that served the answer it names."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvmigrate.feedback.request import Feedback
from kvmigrate.recorder.convert import stored_conversation
from kvmigrate.recorder.feedback_sink import FeedbackSink
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import open_store
from kvmigrate.report import build_report

KEY = b"k" * 32


def _record(i: int, backend: str, ts: float) -> Record:
    return Record(
        request_id=f"r{i}", ts=ts, route="chat/completions", backend=backend, role="serve",
        model="m", served_model="m", conversation=stored_conversation(f"s{i}", "redacted", KEY),
        turn=1, stream=False, status=200, latency_ms=10.0, source="t", content="redacted",
        response_id=stored_conversation(f"chatcmpl-{i}", "redacted", KEY),
    )  # fmt: skip


@pytest.mark.parametrize("where", ["postgres", "sqlite"])
def test_a_score_joins_its_answer(
    where: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = request.getfixturevalue("pg_url") if where == "postgres" else f"sqlite:///{tmp_path}/r.db"
    now = time.time()
    with open_store(url) as store:
        # Its number depends on the migrations merged before it; its name does not.
        assert any(name.endswith("_feedback") for name in store.applied_migrations())
        store.insert([_record(1, "hosted", now), _record(2, "vllm", now)])
    sink = FeedbackSink(url, "redacted", KEY, "t")
    try:
        sink.write(Feedback("satisfaction", 5.0, response_id="chatcmpl-1", comment="mail a@b.co"))
        sink.write(Feedback("satisfaction", 2.0, conversation_id="s2"))
    finally:
        sink.close()
    with open_store(url) as store:
        comments = store.query("SELECT comment FROM feedback ORDER BY value DESC")
        report = build_report(store, now - 1, now + 1)
    assert comments[0][0] is not None
    assert "a@b.co" not in comments[0][0]
    assert comments[1][0] is None
    users = report.users
    assert users is not None
    hosted, vllm = users.arm("hosted"), users.arm("vllm")
    assert hosted is not None
    assert vllm is not None
    assert (hosted.scores, hosted.score_mean, vllm.scores, vllm.score_mean) == (1, 5.0, 1, 2.0)
    assert users.unmatched_scores == 0
