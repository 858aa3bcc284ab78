"""Decode timing goes from an exchange into its record (migration m011_decode) and back out
to the gates' windows and the report, in SQLite and PostgreSQL alike."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from kvmigrate.exchange import Exchange, Role
from kvmigrate.recorder import open_store, window_stats
from kvmigrate.recorder.convert import RecordConverter
from kvmigrate.report import build_report

COHORTS = ("billing-bot", "support-bot")


def _stream(i: int, backend: str, decode_s: float, tokens: int | None) -> Exchange:
    """A streamed chat answer whose first byte came 0.1 s in and whose last chunk came
    `decode_s` later, in 10 more chunks, the longest gap 0.05 s."""
    x = Exchange(
        request_id=f"{backend}-{i}", route="chat/completions", backend=backend,
        role=Role.SERVE, model="m", served_model="m", conversation=f"c{i}", turn=1,
        stream=True, started=0.0, status=200, first_byte=0.1, finished=0.1 + decode_s + 0.01,
        last_chunk=0.1 + decode_s, later_chunks=10, max_chunk_gap=0.05,
        cohort=COHORTS[i % 2],
    )  # fmt: skip
    usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + (tokens or 0)}
    events = [{"choices": [{"index": 0, "delta": {"content": "hi"}}]}]
    if tokens is not None:
        events.append({"choices": [], "usage": usage})
    x.chunks = [
        b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events),
        b"data: [DONE]\n\n",
    ]
    return x


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/records.db"
    return str(request.getfixturevalue("pg_url"))


def test_decode_timing_reaches_the_window_and_the_report(url: str) -> None:
    convert = RecordConverter("none", "test")
    # hosted: 21 tokens in 0.1 s after the first (200 tok/s); vllm: 21 in 0.4 s (50 tok/s).
    records = [convert((_stream(i, "hosted", 0.1, 21), 1000.0 + i)) for i in range(30)]
    records += [convert((_stream(i, "vllm", 0.4, 21), 1000.0 + i)) for i in range(30)]
    records.append(convert((_stream(99, "vllm", 0.4, None), 1050.0)))  # no usage
    first = records[0]
    assert (first.decode_ms, first.decode_chunks, first.chunk_gap_max_ms) == pytest.approx(
        (100.0, 10, 50.0)
    )
    with open_store(url) as store:
        assert "m011_decode" in store.applied_migrations()
        store.insert(records)
        windows = window_stats(store, since=0.0, until=2000.0)
        report = build_report(store, since=0.0, until=2000.0, primary="hosted", candidate="vllm")
    assert windows["hosted"].tps_sample == pytest.approx((200.0,) * 30)
    assert windows["vllm"].tps_sample == pytest.approx((50.0,) * 30)
    decode = {d.backend: d for d in report.decode}
    assert (decode["hosted"].streams, decode["hosted"].no_usage) == (30, 0)
    assert (decode["vllm"].streams, decode["vllm"].no_usage) == (30, 1)
    assert decode["vllm"].tps_p50 == pytest.approx(50.0)
    assert decode["vllm"].tpot_p50_ms == pytest.approx(20.0)
    assert decode["vllm"].gap_p50_ms == pytest.approx(40.0)
    assert decode["vllm"].gap_max_p95_ms == pytest.approx(50.0)
    assert report.decode_difference.difference == pytest.approx(-150.0)
    assert report.decode_difference.high == pytest.approx(-150.0)  # no spread: no width
    # Each cohort's view has its own decode figures, on its own streams.
    assert [c.cohort for c in report.cohorts] == list(COHORTS)
    for cohort in report.cohorts:
        streams = {d.backend: d.streams for d in cohort.decode}
        assert streams == {"hosted": 15, "vllm": 15}
        assert cohort.decode_difference.difference == pytest.approx(-150.0)
    [tps] = [row for row in report.scorecard if row.key == "tps"]
    assert (tps.primary, tps.candidate, str(tps.status)) == (
        pytest.approx(200.0),
        pytest.approx(50.0),
        "missed",  # exactly 50, surely: not above 50
    )
