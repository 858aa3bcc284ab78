"""Probes of a config change made while the rollout store holds a cohort's state: a
candidate chosen by `rollout --candidate` that the config no longer lists (removed, or its
backend renamed) must not hand its share to another candidate that no gate judged."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.policies import Mode
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.controller import GatesRefused, RolloutController, initial_state
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.state import RolloutState
from kvmigrate.rollout.store import open_store

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  bf16: {{api_base: "http://127.0.0.1:9/v1"}}
  fp8: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, bf16: m, fp8: m, candidates: [{candidates}]}}
rollout: {{state: "sqlite:///{tmp}/state.db", candidate: bf16,
           gates: {{min_conversations: 2, min_requests: 10}}}}
"""


def config(tmp: Path, candidates: str) -> Config:
    return parse_config(CONFIG.format(tmp=tmp, candidates=candidates), env={})


def failing(backend: str) -> BackendWindow:
    return BackendWindow(backend, requests=4000, conversations=400, errors=2000)


@pytest.mark.parametrize(
    ("state", "candidates", "percent", "serving"),
    [
        (RolloutState(Mode.SPLIT, 50, candidate="fp8"), ("bf16", "fp8"), 50, "fp8"),
        (RolloutState(Mode.SPLIT, 50), ("bf16", "fp8"), 50, "bf16"),  # no choice: the first
        (RolloutState(Mode.SPLIT, 50, candidate="fp8"), ("bf16",), 0, "bf16"),  # gone: no share
        (RolloutState(Mode.SPLIT, 50, candidate="fp8"), ("fp8-v2",), 0, "fp8-v2"),  # renamed
    ],
)
def test_a_share_stays_with_the_candidate_that_was_chosen(
    state: RolloutState, candidates: tuple[str, ...], percent: float, serving: str
) -> None:
    snapshot = state.snapshot(config(Path("/tmp"), "bf16").rollout, candidates)
    assert (snapshot.percent, snapshot.candidate) == (percent, serving)


def test_a_removed_candidates_share_is_not_handed_to_another(tmp_path: Path) -> None:
    before = config(tmp_path, "bf16, fp8")
    store = open_store(before.rollout.state, initial_state(before))
    RolloutController(before, store).set_percent(50, cohort="m", candidate="fp8", force=True)
    store.close()

    after = config(tmp_path, "bf16")  # fp8 taken out of the model's candidates
    store = open_store(after.rollout.state, initial_state(after))
    try:
        live = LiveRollout(after, store)
        asyncio.run(live.running())  # reads the stored state; its watcher task is dropped

        async def served() -> set[str]:
            routes = [await live.route(f"c{i}", 1, {"hosted", "bf16"}, "m") for i in range(200)]
            return {r.serve for r in routes}

        assert asyncio.run(served()) == {"hosted"}
        controller = RolloutController(after, store, lambda since, c: {"bf16": failing("bf16")})
        assert controller.status("m").state.percent == 0
        with pytest.raises(GatesRefused):  # bf16's 50% is a promotion its gates must pass
            controller.set_percent(50, cohort="m")
    finally:
        store.close()
