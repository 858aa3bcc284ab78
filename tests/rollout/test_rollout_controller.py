"""The controller over both real stores: gates, force, rollback, history, races, crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.controller import (
    GatesRefused,
    RolloutController,
    RolloutError,
    initial_state,
)
from kvmigrate.rollout.store import StoreError, open_store

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout:
  state: "{state}"
  gates: {{min_conversations: 2, min_requests: 10}}
"""

# Enough evidence for the interval gates to decide: 1% errors on both sides of 4000
# requests (a 1-point margin), and every candidate TTFT under the 100 ms floor.
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
BAD = {
    **GOOD,
    "vllm": BackendWindow(
        "vllm", requests=4000, conversations=400, errors=1200, ttft_p95=0.08,
        ttft_sample=(0.08,) * 4000,
    ),
}  # fmt: skip


def make_config(state: str) -> Config:
    return parse_config(CONFIG.format(state=state), env={})


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        return str(request.getfixturevalue("fresh_redis_url"))
    return f"sqlite:///{tmp_path}/state.db"


@pytest.fixture
def controller(state_url: str) -> Iterator[RolloutController]:
    config = make_config(state_url)
    evidence = {"windows": GOOD}
    ctl = RolloutController(
        config,
        open_store(state_url, initial_state(config)),
        lambda since, cohort: evidence["windows"],
    )
    ctl.evidence = evidence  # type: ignore[attr-defined]
    yield ctl
    ctl.store.close()


def test_promotion_passes_gates_and_records_them(controller: RolloutController) -> None:
    outcome = controller.set_percent(10, "first step", "tester")
    assert outcome.state.mode == "split"
    assert outcome.state.percent == 10
    assert all(g.verdict.value == "passed" for g in outcome.gates)
    outcome = controller.set_percent(50, "second step", "tester")
    assert outcome.state.last_good_percent == 10  # the evidence came from the 10% step
    history = controller.store.history()
    assert [(e.action, e.to_percent, e.actor) for e in history] == [
        ("promote", 10, "tester"),
        ("promote", 50, "tester"),
    ]
    assert history[1].gates
    assert history[1].reason == "second step"


def test_failing_gate_refuses_and_changes_nothing(controller: RolloutController) -> None:
    controller.evidence["windows"] = BAD  # type: ignore[attr-defined]
    before = controller.read()
    with pytest.raises(GatesRefused) as refused:
        controller.set_percent(10)
    assert "error_rate failed" in str(refused.value)
    assert controller.read() == before
    assert controller.store.history() == []


def test_inconclusive_without_evidence(controller: RolloutController) -> None:
    controller.evidence["windows"] = {}  # type: ignore[attr-defined]
    with pytest.raises(GatesRefused) as refused:
        controller.set_percent(10)
    assert {g.verdict.value for g in refused.value.results} == {"inconclusive"}


def test_force_overrides_and_is_recorded(controller: RolloutController) -> None:
    controller.evidence["windows"] = BAD  # type: ignore[attr-defined]
    outcome = controller.set_percent(50, "hotfix", "oncall", force=True)
    assert outcome.event.forced
    assert outcome.state.last_good_percent == 0  # forcing proves nothing
    assert controller.store.history()[-1].forced


def test_lowering_needs_no_gates(controller: RolloutController) -> None:
    controller.set_percent(50, force=True)
    controller.evidence["windows"] = BAD  # type: ignore[attr-defined]
    assert controller.set_percent(20).state.percent == 20


def test_rollback_goes_to_last_good_then_zero(controller: RolloutController) -> None:
    controller.set_percent(10)
    controller.set_percent(50)
    first = controller.rollback("latency spike")
    assert first.state.percent == 10
    assert first.state.epoch == 1
    second = controller.rollback()
    assert second.state.percent == 0
    assert second.state.epoch == 2
    with pytest.raises(RolloutError, match="nothing to roll back"):
        controller.rollback()
    assert [e.action for e in controller.store.history()][-2:] == ["rollback", "rollback"]


def test_conditional_rollback_happens_once(controller: RolloutController) -> None:
    controller.set_percent(10)
    state = controller.set_percent(50).state
    controller.rollback(actor="proxy-a", automatic=True, expected_version=state.version)
    with pytest.raises(RolloutError, match="changed since"):
        controller.rollback(actor="proxy-b", automatic=True, expected_version=state.version)
    assert controller.read().percent == 10  # one rollback, not two


@pytest.mark.parametrize("percent", [-1, 100.5, float("nan")])
def test_bad_percent_changes_nothing(controller: RolloutController, percent: float) -> None:
    with pytest.raises(RolloutError):
        controller.set_percent(percent, force=True)
    assert controller.store.history() == []


def test_mode_change(controller: RolloutController) -> None:
    assert controller.set_mode("split").state.mode == "split"
    with pytest.raises(RolloutError):
        controller.set_mode("canary")


WRITER = textwrap.dedent("""
    import sys
    from kvmigrate.config import parse_config
    from kvmigrate.rollout.controller import RolloutController, initial_state
    from kvmigrate.rollout.store import open_store
    url, count, who = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    config = parse_config(sys.stdin.read(), env={})
    ctl = RolloutController(config, open_store(url, initial_state(config)))
    # Writer n's k-th percent differs from every other writer's (4 x 25 writes): a
    # change to where the rollout already is writes nothing, and each of these must write.
    offset = int(who[1:]) * 25
    for i in range(count):
        percent = float(1 + (offset + i) % 100)
        ctl.set_percent(percent, reason=f"{who}-{i}", actor=who, force=True)
""")


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def run_writers(
    url: str, writers: int, count: int, procs: list[subprocess.Popen[bytes]]
) -> list[subprocess.Popen[bytes]]:
    config = CONFIG.format(state=url).encode()
    for n in range(writers):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, url, str(count), f"w{n}"], stdin=subprocess.PIPE
        )
        assert proc.stdin is not None
        proc.stdin.write(config)
        proc.stdin.close()
        procs.append(proc)
    return procs


def assert_consistent(controller: RolloutController) -> list[int]:
    state = controller.read()
    versions = [e.version for e in controller.store.history(100_000)]
    assert versions == list(range(1, len(versions) + 1)), "lost or duplicated versions"
    assert state.version == len(versions)
    return versions


def test_concurrent_writers_never_corrupt(
    controller: RolloutController, spawned: list[subprocess.Popen[bytes]]
) -> None:
    procs = run_writers(controller.store.url, 4, 25, spawned)
    assert all(p.wait(120) == 0 for p in procs)
    assert len(assert_consistent(controller)) == 100


def test_kill_9_mid_write_leaves_a_consistent_state(
    controller: RolloutController, spawned: list[subprocess.Popen[bytes]]
) -> None:
    procs = run_writers(controller.store.url, 2, 100_000, spawned)
    # Kill mid-stream of writes: once several have landed (a count, not a window of time).
    deadline = time.monotonic() + 60
    while len(controller.store.history(100)) <= 5:
        assert time.monotonic() < deadline, "the writers wrote nothing in 60 s"
        time.sleep(0.05)
    for proc in procs:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    versions = assert_consistent(controller)
    assert len(versions) > 5
    if controller.store.url.startswith("sqlite"):
        import sqlite3

        path = controller.store.url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_unreachable_store_is_a_clear_error(tmp_path: Path) -> None:
    config = make_config("redis://127.0.0.1:1/0")
    store = open_store("redis://127.0.0.1:1/0", initial_state(config))
    with pytest.raises(StoreError, match="Redis rollout store"):
        RolloutController(config, store).set_percent(10, force=True)
    bad_dir = tmp_path / "file"
    bad_dir.write_text("not a directory")
    with pytest.raises(StoreError, match="cannot open"):
        open_store(f"sqlite:///{bad_dir}/state.db", initial_state(config))
