"""`kvmigrate report` by cohort: a fleet-wide headline, then each cohort on its own traffic;
records from before cohorts count for their model's own cohort."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import open_store
from kvmigrate.report import RENDERERS, build_report


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
