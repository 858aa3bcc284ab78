"""Stored figures the recorder would not write (a database edited by hand, a PostgreSQL
`'Infinity'`), and calls that failed fast, never crash the report nor flatter a backend."""

from __future__ import annotations

import json
import time
from pathlib import Path

from kvmigrate.recorder import Record, open_store
from kvmigrate.report import RENDERERS, build_report


def _call(n: int, backend: str, role: str, **fields: object) -> Record:
    values: dict[str, object] = dict(
        route="chat/completions", model="m", served_model="m", conversation=f"c{n}", turn=1,
        stream=False, status=200, error=None, latency_ms=1000.0,
    )  # fmt: skip
    values.update(fields)
    return Record(f"r{n}", time.time() - 60 + n, backend=backend, role=role, **values)  # type: ignore[arg-type]


def test_an_infinite_parity_score_is_left_unscored(tmp_path: Path) -> None:
    scored = dict(pair_id="r0", parity_kind="candidate", parity_applicable='["text"]')
    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.insert(
            [
                _call(0, "hosted", "serve"),
                _call(1, "vllm", "shadow", parity_score=float("inf"), **scored),
                _call(2, "vllm", "shadow", parity_score=float("-inf"), **scored),
                _call(3, "vllm", "shadow", parity_score=0.5, **scored),
            ]
        )
        report = build_report(store, since=0)
    assert report.parity.samples == 1
    assert report.parity.mean == 0.5
    for render in RENDERERS.values():
        assert render(report)
    json.loads(RENDERERS["json"](report), parse_constant=lambda c: 1 / 0)


def test_calls_that_failed_fast_do_not_lower_a_backends_latency(tmp_path: Path) -> None:
    """Half the candidate's calls are a 503 in 1 ms: its latency is that of its answers,
    as its TTFT is, and its error rate says the rest."""
    calls = [_call(n, "hosted", "serve") for n in range(10)]
    calls += [_call(10 + n, "vllm", "shadow", pair_id=f"r{n}") for n in range(5)]
    calls += [
        _call(20 + n, "vllm", "shadow", pair_id=f"r{5 + n}", status=503, latency_ms=1.0)
        for n in range(5)
    ]
    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.insert(calls)
        report = build_report(store, since=0)
    vllm = next(b for b in report.backends if b.backend == "vllm")
    assert vllm.errors == 5
    assert vllm.latency_p50_ms == 1000.0
    assert min(ms for ms, _ in report.latency_cdf["vllm"]) == 1000.0
