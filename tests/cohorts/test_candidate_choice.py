"""`rollout --candidate`: one candidate serves a cohort at a time, and the gates judge the
one that would serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmigrate.config import parse_config
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.controller import (
    GatesRefused,
    RolloutController,
    RolloutError,
    initial_state,
)
from kvmigrate.rollout.store import open_store

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  bf16: {{api_base: "http://127.0.0.1:9/v1"}}
  fp8: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, bf16: m, fp8: m, candidates: [bf16, fp8]}}
  - {{model_name: other, hosted: o, bf16: o}}
rollout: {{state: "sqlite:///{tmp}/state.db", candidate: bf16,
           gates: {{min_conversations: 2, min_requests: 10}}}}
"""


def window(backend: str, errors: int) -> BackendWindow:
    # Enough requests for the interval gates to decide on a 1-point error margin, and every
    # TTFT under the 100 ms floor.
    return BackendWindow(
        backend, requests=4000, conversations=400, errors=errors, ttft_p50=0.05,
        ttft_p95=0.08, ttft_sample=(0.08,) * 4000,
    )  # fmt: skip


def test_one_candidate_serves_at_a_time_and_the_gates_judge_it(tmp_path: Path) -> None:
    config = parse_config(CONFIG.format(tmp=tmp_path), env={})
    evidence = {
        "hosted": window("hosted", 40),
        "bf16": window("bf16", 1200),
        "fp8": window("fp8", 40),
    }
    store = open_store(config.rollout.state, initial_state(config))
    controller = RolloutController(config, store, lambda since, cohort: evidence)
    try:
        assert controller.status("m").candidate == "bf16"  # the first of its candidates
        with pytest.raises(GatesRefused):  # bf16 fails its error-rate gate
            controller.set_percent(10, cohort="m")
        outcome = controller.set_percent(10, cohort="m", candidate="fp8")
        assert (outcome.state.candidate, outcome.event.candidate) == ("fp8", "fp8")
        assert controller.status("m").candidate == "fp8"
        with pytest.raises(RolloutError, match="fp8 serves 10% of m"):
            controller.set_percent(50, cohort="m", candidate="bf16", force=True)
        with pytest.raises(RolloutError, match="not a candidate of other"):
            controller.set_percent(10, cohort="other", candidate="fp8", force=True)
        controller.set_percent(50, cohort="m")  # stays on fp8
        assert controller.read("m").candidate == "fp8"
        controller.rollback(cohort="m")
        controller.set_percent(0, cohort="m")
        switched = controller.set_percent(0, cohort="m", candidate="bf16")
        assert switched.state.candidate == "bf16"
    finally:
        store.close()
