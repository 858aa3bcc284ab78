"""What counts as a promotion, and what a change writes (outside probe D): raising the share
the candidate serves by any means passes the gates; a refused change writes nothing; a change
to where the rollout already is writes nothing and keeps the gates' evidence; `rollout auto`
promotes only from the state it last saw."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import Config, parse_config
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.auto import AutoSettings, auto_rollout
from kvmigrate.rollout.client import LocalRollout
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
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout:
  mode: {mode}
  percent: {percent}
  state: "{state}"
  steps: [10, 50]
  gates: {{min_conversations: 2, min_requests: 10}}
record: {{db: "sqlite:///{root}/records.db"}}
"""

# Enough evidence for every gate to pass: equal error rates on 4000 requests each, and a
# candidate TTFT under the floor (as tests/rollout/test_rollout_controller.py's GOOD).
GOOD = {
    "hosted": BackendWindow(
        "hosted", requests=4000, conversations=400, errors=40, ttft_p50=0.3, ttft_p95=0.5,
        ttft_sample=(0.5,) * 4000,
    ),
    "vllm": BackendWindow(
        "vllm", requests=4000, conversations=400, errors=40, ttft_p50=0.05, ttft_p95=0.08,
        ttft_sample=(0.08,) * 4000,
    ),
}  # fmt: skip


class Evidence:
    """Gate evidence that, like the records database, holds only traffic seen before the
    test started: a window that opens at a later change finds none."""

    def __init__(self) -> None:
        self.windows: dict[str, BackendWindow] = GOOD
        self.recorded_until = time.time()

    def __call__(self, since: float, _cohort: str) -> dict[str, BackendWindow]:
        return self.windows if since < self.recorded_until else {}


def make_config(root: Path, state: str, mode: str = "shadow", percent: float = 0) -> Config:
    return parse_config(CONFIG.format(root=root, state=state, mode=mode, percent=percent), env={})


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        return str(request.getfixturevalue("fresh_redis_url"))
    return f"sqlite:///{tmp_path}/state.db"


def controller_for(config: Config) -> RolloutController:
    store = open_store(config.rollout.state, initial_state(config))
    return RolloutController(config, store, Evidence())


@pytest.fixture
def controller(tmp_path: Path, state_url: str) -> Iterator[RolloutController]:
    ctl = controller_for(make_config(tmp_path, state_url))
    yield ctl
    ctl.store.close()


@pytest.fixture
def seeded_at_50(tmp_path: Path, state_url: str) -> Iterator[RolloutController]:
    """A config that seeds shadow mode at 50%: a split would serve the candidate 50%."""
    ctl = controller_for(make_config(tmp_path, state_url, percent=50))
    yield ctl
    ctl.store.close()


def evidence(controller: RolloutController) -> Evidence:
    assert isinstance(controller.windows, Evidence)
    return controller.windows


# 1. `rollout auto` and a rollback made while it waits for evidence


def test_auto_stops_when_the_cohort_is_rolled_back_while_it_waits(
    controller: RolloutController,
) -> None:
    controller.set_percent(10, "start", force=True)
    evidence(controller).windows = {}  # 50% waits for evidence ...

    def sleep(_seconds: float) -> None:
        # ... meanwhile a proxy rolls the cohort back, and then the evidence arrives
        if controller.read().percent == 10:
            controller.rollback("simulated auto-rollback", actor="proxy", automatic=True)
        evidence(controller).windows = GOOD
        evidence(controller).recorded_until = math.inf

    result = auto_rollout(
        LocalRollout(controller, "auto"),
        AutoSettings(bake_seconds=0, step_timeout=60, poll_seconds=0),
        sleep=sleep,
    )
    assert not result.completed
    assert "rolled back" in result.message or "changed" in result.message
    assert "auto-rollback" in result.message
    assert controller.read().percent == 0  # the rollback stands: no 0% -> 50% jump
    assert [e.action for e in controller.store.history()] == ["promote", "auto-rollback"]


def test_a_promotion_from_a_state_no_longer_current_is_refused(
    controller: RolloutController,
) -> None:
    seen = controller.set_percent(10, force=True).state.version
    controller.rollback()
    with pytest.raises(RolloutError, match="changed"):
        controller.set_percent(50, expected_version=seen)
    assert controller.read().percent == 0
    assert len(controller.store.history()) == 2


# 3. `--mode split` is a promotion when it gives the candidate a share


def test_a_split_of_a_seeded_share_passes_the_gates(seeded_at_50: RolloutController) -> None:
    evidence(seeded_at_50).windows = {}
    with pytest.raises(GatesRefused, match="50%"):
        seeded_at_50.set_mode("split", "flip")
    assert seeded_at_50.read().mode == "shadow"
    assert seeded_at_50.store.history() == []
    forced = seeded_at_50.set_mode("split", "flip", force=True)
    assert forced.event.forced
    assert forced.state.mode == "split"


def test_a_split_with_evidence_is_recorded_as_a_promotion(
    seeded_at_50: RolloutController,
) -> None:
    outcome = seeded_at_50.set_mode("split", "flip")
    assert outcome.event.action == "promote"
    assert outcome.gates
    assert not outcome.event.forced


def test_resuming_a_paused_split_passes_the_gates(controller: RolloutController) -> None:
    controller.set_percent(50, force=True)
    controller.set_mode("shadow", "pause")  # lowers the share: no gates
    with pytest.raises(GatesRefused):
        controller.set_mode("split", "resume")  # no evidence since the pause
    assert controller.read().mode == "shadow"


# 4. A mode and a percent in one change; no-op changes


def test_a_mode_and_a_percent_are_one_change_judged_on_the_evidence_before_it(
    controller: RolloutController,
) -> None:
    outcome = controller.change(percent=10, mode="split", reason="both")
    assert (outcome.state.mode, outcome.state.percent) == ("split", 10)
    assert [(e.action, e.to_mode, e.to_percent) for e in controller.store.history()] == [
        ("promote", "split", 10)
    ]


def test_a_refused_mode_and_percent_write_nothing(controller: RolloutController) -> None:
    evidence(controller).windows = {}
    with pytest.raises(GatesRefused):
        controller.change(percent=10, mode="split")
    assert controller.store.history() == []
    assert controller.read() == initial_state(controller.config)


@pytest.mark.parametrize("percent", [0.0, -0.0])
def test_a_change_to_where_the_rollout_is_writes_nothing(
    controller: RolloutController, percent: float
) -> None:
    for outcome in (
        controller.set_mode("shadow", "already shadow"),
        controller.set_percent(percent, "already 0"),
        controller.change(percent=percent, mode="shadow"),
    ):
        assert not outcome.changed
        assert outcome.state.version == 0
    assert controller.store.history() == []
    # ... so the gates still see the evidence gathered before it
    assert controller.set_percent(10).event.action == "promote"


def test_minus_zero_is_recorded_as_zero(controller: RolloutController) -> None:
    controller.set_percent(10, force=True)
    outcome = controller.set_percent(-0.0, "off")
    assert outcome.state.percent == 0
    assert math.copysign(1, outcome.state.percent) == 1
    assert math.copysign(1, controller.store.history()[-1].to_percent) == 1


# The CLI: `--mode X --percent N` goes through as one change


def write_config(root: Path) -> Path:
    path = root / "config.yaml"
    state = f"sqlite:///{root}/state.db"
    path.write_text(CONFIG.format(root=root, state=state, mode="shadow", percent=0))
    return path


def test_cli_mode_and_percent_refused_write_nothing(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    args = ["rollout", "--config", str(path), "--mode", "split", "--percent", "10"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code != 0
    assert "refused by the gates" in refused.output
    history = CliRunner().invoke(main, ["rollout", "history", "--config", str(path)])
    assert history.output.strip() == "no changes recorded yet"


def test_cli_says_a_no_op_changed_nothing(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    result = CliRunner().invoke(main, ["rollout", "--config", str(path), "--mode", "shadow"])
    assert result.exit_code == 0, result.output
    assert "nothing changed" in result.output
    history = CliRunner().invoke(main, ["rollout", "history", "--config", str(path)])
    assert history.output.strip() == "no changes recorded yet"
