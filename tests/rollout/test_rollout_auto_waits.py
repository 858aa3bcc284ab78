"""`rollout auto` over a real controller and store: a wait that runs out names the
conversations the gates asked for, and a rollout whose evidence grows look by look is
promoted once the interval clears, not before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.auto import AutoSettings, auto_rollout
from kvmigrate.rollout.client import LocalRollout
from kvmigrate.rollout.controller import RolloutController, initial_state
from kvmigrate.rollout.store import open_store

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout:
  state: "sqlite:///{root}/state.db"
  steps: [10]
  gates: {{min_conversations: 2, min_requests: 10}}
"""


def windows(requests: int, candidate_errors: int) -> dict[str, BackendWindow]:
    """Both backends with `requests` each (4 per conversation): the primary fails 1% of
    them, the candidate `candidate_errors`; every TTFT well under the floor."""

    def one(name: str, errors: int) -> BackendWindow:
        return BackendWindow(
            name, requests, requests // 4, errors, ttft_p95=0.05, ttft_sample=(0.05,) * requests
        )

    return {"hosted": one("hosted", requests // 100), "vllm": one("vllm", candidate_errors)}


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return parse_config(CONFIG.format(root=tmp_path), env={})


@pytest.fixture
def evidence(config: Config) -> Iterator[tuple[RolloutController, list[dict[str, BackendWindow]]]]:
    looks: list[dict[str, BackendWindow]] = []
    controller = RolloutController(
        config,
        open_store(config.rollout.state, initial_state(config)),
        lambda _since, _cohort: looks[0],
    )
    yield controller, looks
    controller.store.close()


def test_a_wait_that_runs_out_names_what_the_gates_asked_for(
    evidence: tuple[RolloutController, list[dict[str, BackendWindow]]],
) -> None:
    controller, looks = evidence
    looks.append(windows(2000, 30))  # 1.5% against 1%: the interval straddles the margin
    [error] = [g for g in controller.evaluate() if g.name == "error_rate"]
    assert error.needed_conversations is not None
    result = auto_rollout(
        LocalRollout(controller, "tester"),
        AutoSettings(bake_seconds=0, step_timeout=0, poll_seconds=0),
        sleep=lambda _s: None,
    )
    assert not result.completed
    assert result.message == (
        "gave up on 10%: the evidence stayed inconclusive (the gates asked for about "
        f"{error.needed_conversations} more conversations; --step-timeout waits longer)"
    )
    assert result.steps[0]["gates"][1]["verdict"] == "inconclusive"
    assert controller.store.history(10) == []


def test_growing_evidence_is_promoted_once_the_interval_clears(
    evidence: tuple[RolloutController, list[dict[str, BackendWindow]]],
) -> None:
    controller, looks = evidence
    # An equal candidate (1% errors on both sides), looked at as its traffic grows.
    looks.extend(windows(n, n // 100) for n in range(400, 20_001, 400))
    seen: list[int] = []

    def sleep(_seconds: float) -> None:
        seen.append(looks.pop(0)["vllm"].requests)

    result = auto_rollout(
        LocalRollout(controller, "tester"),
        AutoSettings(bake_seconds=0, step_timeout=3600, poll_seconds=1),
        sleep=sleep,
    )
    assert result.completed, result.message
    promoted_at = looks[0]["vllm"].requests
    [error] = [g for g in controller.store.history(1)[0].gates if g["name"] == "error_rate"]
    assert error["verdict"] == "passed"
    assert error["interval"][1] <= 0.01  # the whole interval within the 1-point margin
    # ... and not on an earlier look, where it was not yet clear
    assert seen
    earlier = RolloutController(
        controller.config, controller.store, lambda _s, _c: windows(seen[-1], seen[-1] // 100)
    )
    assert [g.verdict.value for g in earlier.evaluate() if g.name == "error_rate"] == [
        "inconclusive"
    ]
    assert promoted_at > seen[-1]
