"""`kvmigrate report` by cohort: a fleet-wide headline, then each cohort on its own traffic;
records from before cohorts count for their model's own cohort."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from browser_page import open_page

from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import open_store
from kvmigrate.report import RENDERERS, TimelineEvent, build_report


def record(i: int, model: str, cohort: str | None, backend: str, status: int) -> Record:
    return Record(
        request_id=f"r{i}-{backend}",
        ts=time.time() - 10 + i * 0.01,
        route="chat/completions",
        backend=backend,
        role="serve" if backend == "hosted" else "shadow",
        model=model,
        served_model=model,
        conversation=f"c{i}",
        turn=1,
        stream=True,
        status=status,
        error=None if status == 200 else f"http_{status}",
        ttft_ms=40.0,
        latency_ms=90.0,
        cohort=cohort,
    )


def test_the_report_groups_by_cohort_under_a_fleet_summary(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        rows = [record(i, "gpt-4o-mini", "billing-bot", "vllm", 500) for i in range(4)]
        rows += [record(i, "gpt-4o-mini", "billing-bot", "hosted", 200) for i in range(4)]
        rows += [record(10 + i, "gpt-4o-mini", None, "vllm", 200) for i in range(3)]
        rows += [record(20 + i, "gpt-4o", "gpt-4o", "vllm", 200) for i in range(2)]
        store.insert(rows)
        report = build_report(store, time.time() - 60)
    assert [(c.cohort, [(b.backend, b.requests) for b in c.backends]) for c in report.cohorts] == [
        ("billing-bot", [("hosted", 4), ("vllm", 4)]),
        ("gpt-4o", [("vllm", 2)]),
        ("gpt-4o-mini", [("vllm", 3)]),  # recorded before cohorts: the model's own
    ]
    assert [(b.backend, b.requests) for b in report.backends] == [("hosted", 4), ("vllm", 9)]
    text = RENDERERS["text"](report)
    assert text.index("Headline") < text.index("By cohort")
    billing = [line for line in text.splitlines() if line.startswith("billing-bot  vllm")]
    assert billing, text
    assert "100.0%" in billing[0]  # its candidate failed every call; the others did not
    data = json.loads(RENDERERS["json"](report))
    assert data["cohorts"][0]["backends"][1]["requests"] == 4
    assert "By cohort" in RENDERERS["html"](report)


def test_one_cohort_adds_no_section(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        store.insert([record(i, "gpt-4o-mini", None, "vllm", 200) for i in range(3)])
        report = build_report(store, time.time() - 60)
    assert report.cohorts == []
    assert "By cohort" not in RENDERERS["text"](report)


def scored(i: int, backend: str, score: float) -> Record:
    copy = record(100 + i, "o3-mini", "o3-mini", backend, 200)
    return dataclasses.replace(
        copy,
        request_id=f"s{i}-{backend}",
        role="shadow",
        pair_id=f"r{100 + i}-hosted",
        parity_kind="candidate",
        parity_score=score,
        parity_tool_agree=1.0,
    )


def test_the_report_compares_each_candidate_with_the_primary(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        rows = [record(100 + i, "o3-mini", "o3-mini", "hosted", 200) for i in range(6)]
        rows += [scored(i, "vllm-bf16", 0.9) for i in range(6)]
        rows += [scored(i, "vllm-fp8", 0.5) for i in range(6)]
        store.insert(rows)
        report = build_report(store, time.time() - 60)
    by = report.parity_by_candidate
    assert sorted(by) == ["vllm-bf16", "vllm-fp8"]
    assert (by["vllm-bf16"].samples, by["vllm-fp8"].samples) == (6, 6)
    assert by["vllm-bf16"].mean == pytest.approx(0.9)
    assert by["vllm-fp8"].mean == pytest.approx(0.5)
    text = RENDERERS["text"](report)
    assert "Parity by candidate" in text
    section = text.split("Parity by candidate")[1].splitlines()
    fp8 = next(line for line in section if line.startswith("vllm-fp8  "))
    assert "50.0%" in fp8


def test_one_candidate_adds_no_comparison(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        store.insert([scored(i, "vllm", 0.9) for i in range(3)])
        report = build_report(store, time.time() - 60)
    assert report.parity_by_candidate == {}
    assert "Parity by candidate" not in RENDERERS["text"](report)


def test_the_by_cohort_table_shows_each_cohort_as_its_own_headline(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        rows = [record(i, "gpt-4o-mini", "billing-bot", "vllm", 500) for i in range(4)]
        rows += [record(i, "gpt-4o-mini", "billing-bot", "hosted", 200) for i in range(4)]
        rows += [record(20 + i, "gpt-4o", "gpt-4o", "vllm", 200) for i in range(2)]
        store.insert(rows)
        report = build_report(store, time.time() - 60)
    text = RENDERERS["text"](report)
    table = text.split("By cohort\n")[1].split("\n\n")[0].splitlines()[1:]  # under the rule
    assert table[0].split()[:2] == ["cohort", "backend"]
    assert table[0].endswith("latency p50  latency p95  cache hit")
    for cohort in report.cohorts:
        own = text.split(f"Headline: cohort {cohort.cohort}\n")[1].split("\n\n")[0].splitlines()
        assert len(own) == 3 + len(cohort.backends)
        for line in own[3:]:  # under the title's rule, the header and its rule
            # The same cells as the cohort's own headline, after the cohort's name.
            assert any(row.split() == [cohort.cohort, *line.split()] for row in table), line


def test_one_cohort_renders_as_before(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        store.insert([record(i, "gpt-4o-mini", None, "vllm", 200) for i in range(3)])
        report = build_report(store, time.time() - 60)
    text = RENDERERS["text"](report)
    assert "Cohort " not in text
    assert text.count("Headline") == 1
    assert json.loads(RENDERERS["json"](report))["cohorts"] == []
    html = RENDERERS["html"](report)
    assert 'id="cohort-view"' not in html
    assert html.count('<section class="view"') == 1


def diverging(i: int, cohort: str | None) -> list[Record]:
    """A served answer and its shadow copy, which answered differently (text)."""
    answer = '{{"choices": [{{"index": 0, "message": {{"role": "assistant", "content": "{}"}}}}]}}'
    served = dataclasses.replace(
        record(i, "gpt-4o-mini", cohort, "hosted", 200),
        request_id=f"p{i}",
        content="redacted",
        response_json=answer.format("Paris"),
    )
    copy = dataclasses.replace(
        record(i, "gpt-4o-mini", cohort, "vllm", 200),
        request_id=f"c{i}",
        pair_id=f"p{i}",
        content="redacted",
        response_json=answer.format("Lyon"),
        parity_kind="candidate",
        parity_score=0.4,
        parity_applicable='["text"]',
        parity_disagree='["text"]',
    )
    return [served, copy]


@pytest.mark.browser
def test_divergences_from_before_cohorts_count_for_their_model(tmp_path: Path) -> None:
    """A pair recorded before migration m008 (no cohort) is its model's own cohort's, in the
    divergences view as in every table, so a cohort filter keeps it."""
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        store.insert([*diverging(1, None), *diverging(2, "billing-bot")])
        report = build_report(store, time.time() - 60)
    assert {p.request_id: p.cohort for p in report.divergences} == {
        "c1": "gpt-4o-mini",
        "c2": "billing-bot",
    }
    own = {c.cohort: c for c in report.cohorts}
    assert [p.request_id for p in own["gpt-4o-mini"].divergences] == ["c1"]
    assert (own["gpt-4o-mini"].divergent_total, own["billing-bot"].divergent_total) == (1, 1)
    page = tmp_path / "report.html"
    page.write_text(RENDERERS["html"](report))
    for view in ("#cohort=gpt-4o-mini", "#view=gpt-4o-mini"):
        with open_page(page, view) as shown:
            shown.wait_for("document.body && document.body.dataset.divergencesShown === '1'")
            visible = shown.evaluate(
                "Array.from(document.querySelectorAll('div.pair:not([hidden])'))"
                ".map(p => p.dataset.request)"
            )
            assert visible == ["c1"]


def test_each_cohort_s_timeline_is_its_own_and_the_default_it_followed(tmp_path: Path) -> None:
    now = time.time()
    events = [
        TimelineEvent(now - 50, "shadow", "fleet", 0.0),
        TimelineEvent(now - 40, "split", "billing-bot to 10%", 10.0, cohort="billing-bot"),
        TimelineEvent(now - 30, "split", "fleet to 50%", 50.0),
    ]
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        store.insert([record(i, "gpt-4o-mini", "billing-bot", "vllm", 200) for i in range(2)])
        store.insert([record(10 + i, "gpt-4o", "gpt-4o", "vllm", 200) for i in range(2)])
        report = build_report(store, now - 60, timeline=events)
    own = {c.cohort: [e.detail for e in c.timeline] for c in report.cohorts}
    # billing-bot left the default at its own first change; gpt-4o still follows it.
    assert own == {
        "billing-bot": ["fleet", "billing-bot to 10%"],
        "gpt-4o": ["fleet", "fleet to 50%"],
    }
    assert len(report.timeline) == 3


def test_candidates_without_stored_answers_are_timed_but_not_compared(tmp_path: Path) -> None:
    """record.content none keeps no answers: the two candidates' speed and cache still show
    side by side, their agreement says why it is missing."""
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        rows = [record(100 + i, "o3-mini", "o3-mini", "hosted", 200) for i in range(5)]
        for backend, latency in (("vllm-bf16", 90.0), ("vllm-fp8", 60.0)):
            rows += [
                dataclasses.replace(scored(i, backend, 0.9), latency_ms=latency) for i in range(5)
            ]
        store.insert(rows)
        report = build_report(store, time.time() - 60)
    [pair] = report.candidate_pairs
    assert (pair.a, pair.b, pair.requests, pair.compared) == ("vllm-bf16", "vllm-fp8", 5, 0)
    assert (pair.agreement, pair.agreement_low) == (None, None)
    assert (pair.a_latency_p50_ms, pair.b_latency_p50_ms) == (90.0, 60.0)
    line = next(
        line
        for line in RENDERERS["text"](report).splitlines()
        if line.startswith("vllm-bf16 / vllm-fp8")
    )
    assert "not compared (answers not stored)" in line
    assert "90.0 ms / 60.0 ms" in line


def test_a_model_without_a_rollout_is_no_cohort(tmp_path: Path) -> None:
    """Embeddings on the primary only have no rollout: with the config's cohorts given, a
    round-1 config with them is one cohort, and a narrowed one does not give them a view."""
    embeddings = [
        dataclasses.replace(
            record(30 + i, "text-embedding-3-small", "text-embedding-3-small", "hosted", 200),
            route="embeddings",
        )
        for i in range(2)
    ]
    chat = [record(i, "gpt-4o-mini", "gpt-4o-mini", "vllm", 200) for i in range(3)]
    billing = [record(10 + i, "gpt-4o-mini", "billing-bot", "vllm", 200) for i in range(3)]
    with open_store(f"sqlite:///{tmp_path}/records.db") as store:
        store.insert([*embeddings, *chat])
        round_one = build_report(store, time.time() - 60, candidates_of={"gpt-4o-mini": ["vllm"]})
        store.insert(billing)
        configured = {"billing-bot": ["vllm"], "gpt-4o-mini": ["vllm"]}
        narrowed = build_report(store, time.time() - 60, candidates_of=configured)
    assert round_one.cohorts == []
    assert "Cohort " not in RENDERERS["text"](round_one)
    assert [c.cohort for c in narrowed.cohorts] == ["billing-bot", "gpt-4o-mini"]
    assert sum(b.requests for b in narrowed.backends) == 8  # the fleet still counts them
    assert any("2 calls of models without a rollout" in note for note in narrowed.notes)
