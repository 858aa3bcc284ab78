"""Gates judge a cohort on its own records: a cohort whose candidate fails is refused while
another cohort of the same model and the same candidate is promoted. Records from before
cohorts (no cohort column value) count for their model's own cohort."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvmigrate.config import parse_config
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.recorder.record import Record
from kvmigrate.recorder.store import open_store as open_records
from kvmigrate.rollout.controller import GatesRefused

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama-8b}}
cohorts:
  - {{name: coder, model: gpt-4o-mini, match: {{metadata: {{team: coder}}}}}}
rollout:
  state: "sqlite:///{tmp}/state.db"
  gates: {{min_conversations: 5, min_requests: 20}}
record: {{db: "sqlite:///{tmp}/records.db"}}
"""


MANY = 2000


def records(
    cohort: str | None, backend: str, failing: bool, n: int = 40, conversations: int = 10
) -> list[Record]:
    now = time.time()
    return [
        Record(
            request_id=f"{cohort}-{backend}-{i}",
            ts=now - 5 + i * 0.001,
            route="chat/completions",
            backend=backend,
            role="serve" if backend == "hosted" else "shadow",
            model="gpt-4o-mini",
            served_model="m",
            conversation=f"{cohort}-c{i % conversations}",
            turn=1,
            stream=True,
            status=500 if failing else 200,
            error="http_500" if failing else None,
            ttft_ms=50.0,
            latency_ms=80.0,
            cohort=cohort,
        )
        for i in range(n)
    ]


def test_each_cohort_is_judged_on_its_own_traffic(tmp_path: Path) -> None:
    config = parse_config(CONFIG.format(tmp=tmp_path), env={})
    with open_records(config.record.db) as store:
        store.insert(records("coder", "hosted", failing=False))
        store.insert(records("coder", "vllm", failing=True))
        # The model's own cohort: half recorded before cohorts existed (cohort NULL).
        # Enough conversations for the interval gates to tell 0% from 0% within 1 point.
        store.insert(records(None, "hosted", failing=False, n=MANY, conversations=MANY // 4))
        store.insert(records("gpt-4o-mini", "vllm", failing=False, n=MANY, conversations=MANY // 4))
    controller = open_controller(config)
    try:
        with pytest.raises(GatesRefused) as refused:
            controller.set_percent(10, cohort="coder")
        failed = {g.name for g in refused.value.results if g.verdict.value == "failed"}
        assert "error_rate" in failed
        outcome = controller.set_percent(10, cohort="gpt-4o-mini")
        assert all(g.verdict.value == "passed" for g in outcome.gates), outcome.gates
        traffic = next(g for g in outcome.gates if g.name == "traffic")
        assert traffic.figures["requests"] == MANY  # the coder cohort's calls are not its
        assert controller.read("coder").percent == 0
    finally:
        controller.store.close()
