"""The rollout controller's rules, one table each: what a change's percent and mode mean,
which changes are promotions, what a rollback returns to, and the exact words of each
refusal. A real SQLite state store; evidence that passes or fails every gate."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.policies import Mode
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.controller import (
    ACTOR_MAX_CHARS,
    REASON_MAX_CHARS,
    GatesRefused,
    NoteTooLong,
    RolloutController,
    RolloutError,
    StateChanged,
    check_notes,
    effective_share,
    initial_state,
)
from kvmigrate.rollout.state import Action, RolloutState
from kvmigrate.rollout.store import open_store

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  bf16: {{api_base: "http://127.0.0.1:9/v1"}}
  fp8: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, bf16: m, fp8: m, candidates: [bf16, fp8]}}
  - {{model_name: other, hosted: o, bf16: o}}
cohorts:
  - {{name: beta, model: m, match: {{header: {{X-Tier: beta}}}}, steps: [5, 25]}}
rollout: {{mode: {mode}, percent: {percent}, state: "sqlite:///{tmp}/state.db", candidate: bf16,
           steps: [10, 50, 100], gates: {{min_conversations: 2, min_requests: 10}}}}
"""

ONE = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  bf16: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, bf16: m}}
rollout: {{state: "sqlite:///{tmp}/state.db", candidate: bf16}}
"""


def window(backend: str, errors: int) -> BackendWindow:
    return BackendWindow(
        backend, requests=4000, conversations=400, errors=errors, ttft_p50=0.05,
        ttft_p95=0.08, ttft_sample=(0.08,) * 4000,
    )  # fmt: skip


GOOD = {"hosted": window("hosted", 40), "bf16": window("bf16", 40), "fp8": window("fp8", 40)}
BAD = {"hosted": window("hosted", 40), "bf16": window("bf16", 1200), "fp8": window("fp8", 1200)}


class Evidence:
    def __init__(self) -> None:
        self.windows = GOOD
        self.asked: list[tuple[float, str]] = []

    def __call__(self, since: float, cohort: str) -> dict[str, BackendWindow]:
        self.asked.append((since, cohort))
        return self.windows


def make(
    tmp: Path, text: str = CONFIG, mode: str = "shadow", percent: float = 0
) -> RolloutController:
    config: Config = parse_config(text.format(tmp=tmp, mode=mode, percent=percent), env={})
    return RolloutController(
        config, open_store(config.rollout.state, initial_state(config)), Evidence()
    )


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[RolloutController]:
    c = make(tmp_path)
    yield c
    c.store.close()


def evidence(c: RolloutController) -> Evidence:
    assert isinstance(c.windows, Evidence)
    return c.windows


@pytest.mark.parametrize(
    ("mode", "percent", "share"),
    [
        (Mode.SPLIT, 30.0, 30.0),
        (Mode.SHADOW, 30.0, 0.0),
        (Mode.OBSERVE, 30.0, 0.0),
        (Mode.SPLIT, 0.0, 0.0),
    ],
)
def test_the_effective_share(mode: Mode, percent: float, share: float) -> None:
    assert effective_share(mode, percent) == share


@pytest.mark.parametrize(
    ("reason", "actor", "refused"),
    [
        ("r" * REASON_MAX_CHARS, "a" * ACTOR_MAX_CHARS, None),
        ("r" * (REASON_MAX_CHARS + 1), "a", "reason must be a string of at most 1000 characters"),
        ("r", "a" * (ACTOR_MAX_CHARS + 1), "actor must be a string of at most 200 characters"),
        ("r" * 1001, "a" * 201, "reason must be a string of at most 1000 characters"),
    ],
)
def test_notes_are_refused_past_their_limits(reason: str, actor: str, refused: str | None) -> None:
    assert (REASON_MAX_CHARS, ACTOR_MAX_CHARS) == (1000, 200)
    if refused is None:
        check_notes(reason, actor)
        return
    with pytest.raises(NoteTooLong) as caught:
        check_notes(reason, actor)
    assert str(caught.value) == refused
    assert caught.value.field == refused.split()[0]


def test_the_initial_state_is_the_configs(tmp_path: Path) -> None:
    config = parse_config(CONFIG.format(tmp=tmp_path, mode="split", percent=10), env={})
    assert initial_state(config) == RolloutState(
        mode=Mode.SPLIT, percent=10.0, updated_at=0.0, updated_by="config"
    )


@pytest.mark.parametrize(
    ("selector", "cohort", "refused"),
    [
        ("m", "m", None),
        ("beta", "beta", None),
        (
            None,
            None,
            "this config has 3 cohorts; name one with --model or --cohort: beta, m, other",
        ),
        ("be", None, "no cohort 'be'; cohorts: beta, m, other"),
        ("M", None, "no cohort 'M'; cohorts: beta, m, other"),
    ],
)
def test_which_cohort_a_change_is_about(
    ctl: RolloutController, selector: str | None, cohort: str | None, refused: str | None
) -> None:
    if refused is None:
        assert ctl.cohort_of(selector) == cohort
        return
    with pytest.raises(RolloutError) as caught:
        ctl.cohort_of(selector)
    assert str(caught.value) == refused


def test_a_config_of_one_cohort_needs_no_name(tmp_path: Path) -> None:
    c = make(tmp_path, ONE)
    try:
        assert c.cohort_of() == "m"
        assert c.read().percent == 0.0
        with pytest.raises(RolloutError, match=r"^no cohort 'x'; cohorts: m$"):
            c.cohort_of("x")
    finally:
        c.store.close()


@pytest.mark.parametrize(
    ("percent", "mode", "refused"),
    [
        (None, None, "give a percent or a mode"),
        (-1.0, None, "percent must be between 0 and 100, got -1"),
        (100.5, None, "percent must be between 0 and 100, got 100.5"),
        (math.nan, None, "percent must be between 0 and 100, got nan"),
        (None, "observe", "mode must be shadow or split, got 'observe'"),
        (None, "SPLIT", "mode must be shadow or split, got 'SPLIT'"),
        (10.0, "both", "mode must be shadow or split, got 'both'"),
    ],
)
def test_a_change_out_of_range_is_refused_before_anything_is_read(
    ctl: RolloutController, percent: float | None, mode: str | None, refused: str
) -> None:
    with pytest.raises(RolloutError) as caught:
        ctl.change(percent, mode, cohort="m")
    assert str(caught.value) == refused
    assert ctl.history(cohort="m") == []


# (start mode, start percent) -> change (percent, mode) -> (mode, percent, action, promotion)
@pytest.mark.parametrize(
    ("start", "change", "after", "action", "promotion"),
    [
        ((Mode.SHADOW, 0.0), (10.0, None), (Mode.SPLIT, 10.0), Action.PROMOTE, True),
        ((Mode.SHADOW, 0.0), (100.0, None), (Mode.SPLIT, 100.0), Action.PROMOTE, True),
        ((Mode.SHADOW, 0.0), (None, "split"), (Mode.SPLIT, 0.0), Action.MODE, False),
        ((Mode.SHADOW, 30.0), (None, "split"), (Mode.SPLIT, 30.0), Action.PROMOTE, True),
        ((Mode.SHADOW, 30.0), (0.0, None), (Mode.SHADOW, 0.0), Action.SET, False),
        ((Mode.SHADOW, 30.0), (20.0, "shadow"), (Mode.SHADOW, 20.0), Action.SET, False),
        ((Mode.SPLIT, 30.0), (10.0, None), (Mode.SPLIT, 10.0), Action.SET, False),
        ((Mode.SPLIT, 30.0), (None, "shadow"), (Mode.SHADOW, 30.0), Action.MODE, False),
        ((Mode.SPLIT, 30.0), (50.0, None), (Mode.SPLIT, 50.0), Action.PROMOTE, True),
        ((Mode.SPLIT, 30.0), (0.0, None), (Mode.SPLIT, 0.0), Action.SET, False),
        ((Mode.SPLIT, 30.0), (-0.0, None), (Mode.SPLIT, 0.0), Action.SET, False),
    ],
)
def test_what_a_change_means(
    tmp_path: Path,
    start: tuple[Mode, float],
    change: tuple[float | None, str | None],
    after: tuple[Mode, float],
    action: Action,
    promotion: bool,
) -> None:
    c = make(tmp_path, mode=start[0], percent=start[1])
    try:
        evidence(c).windows = BAD
        if promotion:
            with pytest.raises(GatesRefused) as caught:
                c.change(*change, cohort="m", reason="why", actor="ops")
            assert caught.value.target == after[1]
            assert c.history(cohort="m") == []
            evidence(c).windows = GOOD
        outcome = c.change(*change, cohort="m", reason="why", actor="ops")
        assert (outcome.state.mode, outcome.state.percent) == after
        assert math.copysign(1.0, outcome.state.percent) == 1.0  # never "-0%"
        assert outcome.changed
        event = outcome.event
        assert (event.action, event.from_mode, event.from_percent) == (action, start[0], start[1])
        assert (event.to_mode, event.to_percent, event.actor, event.reason) == (
            *after,
            "ops",
            "why",
        )
        assert event.forced is False
        assert event.version == outcome.state.version == 1
        assert (outcome.gates != []) is promotion
        assert (len(event.gates) > 0) is promotion
        assert c.read("m") == outcome.state
    finally:
        c.store.close()


def test_a_change_to_where_the_rollout_is_writes_nothing(ctl: RolloutController) -> None:
    first = ctl.set_percent(10, cohort="m", actor="ops")
    again = ctl.set_percent(10, cohort="m", actor="bot", reason="again")
    assert again.changed is False
    assert again.state == first.state
    assert (again.event.action, again.event.actor, again.event.reason, again.event.cohort) == (
        Action.SET,
        "bot",
        "again",
        "m",
    )
    assert (again.event.from_percent, again.event.to_percent, again.event.version) == (
        10.0,
        10.0,
        1,
    )
    mode = ctl.set_mode("split", cohort="m")
    assert (mode.changed, mode.event.action) == (False, Action.MODE)
    assert len(ctl.history(cohort="m")) == 1


def test_a_failing_promotion_is_refused_with_the_failing_gates(ctl: RolloutController) -> None:
    evidence(ctl).windows = BAD
    with pytest.raises(GatesRefused) as caught:
        ctl.set_percent(10, cohort="m")
    message = str(caught.value)
    assert message.startswith("promotion to 10% refused by the gates: error_rate failed: ")
    assert message.endswith(". Use --force to override (the override is recorded).")
    assert "traffic" not in message  # a passing gate is not listed
    forced = ctl.set_percent(10, cohort="m", force=True, reason="ship it")
    assert forced.event.forced is True
    assert forced.event.action == Action.PROMOTE
    assert forced.state.last_good_percent == 0.0  # a forced step is no good step


def test_a_vouched_step_becomes_the_step_to_roll_back_to(ctl: RolloutController) -> None:
    ctl.set_percent(10, cohort="m")
    ctl.set_percent(50, cohort="m")
    state = ctl.read("m")
    assert (state.percent, state.last_good_percent) == (50.0, 10.0)
    back = ctl.rollback(cohort="m", reason="slow", actor="ops")
    assert (back.state.percent, back.state.last_good_percent, back.state.epoch) == (10.0, 10.0, 1)
    assert (back.event.action, back.event.from_percent, back.event.to_percent) == (
        Action.ROLLBACK,
        50.0,
        10.0,
    )
    assert (back.event.reason, back.event.actor, back.event.forced) == ("slow", "ops", False)
    again = ctl.rollback(cohort="m", automatic=True, reason="r" * 5000, actor="a" * 500)
    assert (again.state.percent, again.state.last_good_percent, again.state.epoch) == (0.0, 0.0, 2)
    assert again.event.action == Action.AUTO_ROLLBACK
    assert (len(again.event.reason), len(again.event.actor)) == (1000, 200)
    with pytest.raises(
        RolloutError, match=r"^nothing to roll back: the candidate serves no traffic$"
    ):
        ctl.rollback(cohort="m")


def test_a_rollback_from_the_good_step_itself_goes_to_zero(ctl: RolloutController) -> None:
    ctl.set_percent(10, cohort="m")
    ctl.set_percent(50, cohort="m")
    ctl.set_percent(10, cohort="m")  # lowered by hand to the good step
    back = ctl.rollback(cohort="m")
    assert (back.state.percent, back.state.last_good_percent) == (0.0, 0.0)


def test_a_rollback_refuses_a_shadow_state_and_a_stale_version(ctl: RolloutController) -> None:
    ctl.change(30, "shadow", cohort="m")
    with pytest.raises(
        RolloutError, match=r"^nothing to roll back: the candidate serves no traffic$"
    ):
        ctl.rollback(cohort="m")
    ctl.set_mode("split", cohort="m")
    with pytest.raises(RolloutError, match=r"^the rollout changed since the breach was seen$"):
        ctl.rollback(cohort="m", expected_version=1)
    assert ctl.rollback(cohort="m", expected_version=2).state.percent == 0.0
    with pytest.raises(NoteTooLong):
        ctl.rollback(cohort="m", reason="r" * 1001)


def test_a_change_from_a_version_no_longer_current_is_refused(ctl: RolloutController) -> None:
    ctl.set_percent(10, cohort="m")
    with pytest.raises(StateChanged) as caught:
        ctl.set_percent(50, cohort="m", expected_version=0)
    assert str(caught.value) == "the rollout changed since version 0 (now version 1: split 10%)"
    assert ctl.set_percent(50, cohort="m", expected_version=1).state.version == 2


def test_switching_candidates(ctl: RolloutController) -> None:
    assert ctl.serving(ctl.read("m"), "m") == "bf16"
    with pytest.raises(RolloutError) as caught:
        ctl.set_percent(10, cohort="m", candidate="fp")
    assert str(caught.value) == "'fp' is not a candidate of m; its: bf16, fp8"
    outcome = ctl.set_percent(10, cohort="m", candidate="fp8")
    assert (outcome.state.candidate, outcome.event.candidate) == ("fp8", "fp8")
    with pytest.raises(RolloutError) as caught:
        ctl.set_percent(20, cohort="m", candidate="bf16")
    assert (
        str(caught.value)
        == "fp8 serves 10% of m: set it to 0% (or roll back) before switching to bf16"
    )
    # the same candidate named again is no switch
    assert ctl.set_percent(20, cohort="m", candidate="fp8").state.percent == 20.0
    ctl.set_percent(0, cohort="m")
    switched = ctl.set_percent(0, cohort="m", candidate="bf16")
    assert switched.changed
    assert (switched.state.candidate, switched.state.last_good_percent) == ("bf16", 0.0)


def test_the_next_step_and_the_status(ctl: RolloutController) -> None:
    assert ctl.next_step(cohort="m") == 10.0
    assert ctl.next_step(cohort="beta") == 5.0
    ctl.set_percent(10, cohort="m")
    assert ctl.next_step(cohort="m") == 50.0
    assert ctl.next_step(RolloutState(mode=Mode.SPLIT, percent=100.0), cohort="m") is None
    assert ctl.next_step(RolloutState(mode=Mode.SHADOW, percent=100.0), cohort="m") == 10.0
    status = ctl.status("m")
    assert (status.cohort, status.candidate, status.next_step, status.steps) == (
        "m",
        "bf16",
        50.0,
        [10.0, 50.0, 100.0],
    )
    assert [(c.backend, c.serving) for c in status.candidates] == [("bf16", True), ("fp8", False)]
    assert status.gates_for_next_step == status.candidates[0].gates != []
    assert status.candidates[1].gates != []
    assert {(d.a, d.b) for d in status.comparisons} == {("bf16", "fp8")}
    assert status.store.startswith("sqlite:///")
    assert [s.cohort for s in ctl.statuses()] == ["beta", "m", "other"]
    other = ctl.statuses()[2]
    assert (other.candidate, [c.backend for c in other.candidates]) == ("bf16", ["bf16"])


def test_status_reads_no_evidence_without_a_next_step_or_a_rival(tmp_path: Path) -> None:
    c = make(tmp_path, ONE)
    try:
        c.set_percent(100)
        evidence(c).asked.clear()
        status = c.status()
        assert (status.next_step, status.gates_for_next_step, evidence(c).asked) == (None, [], [])
    finally:
        c.store.close()


def test_the_gates_judge_the_cohorts_own_traffic_since_its_last_change(
    ctl: RolloutController,
) -> None:
    ctl.evaluate(cohort="beta")
    since, cohort = evidence(ctl).asked[-1]
    assert cohort == "beta"
    assert since > 1e9  # the window's start, not the state's time 0
    changed = ctl.set_percent(5, cohort="beta")
    ctl.evaluate(cohort="beta")
    assert evidence(ctl).asked[-1] == (changed.state.updated_at, "beta")


def test_without_evidence_every_gate_waits(tmp_path: Path) -> None:
    config = parse_config(ONE.format(tmp=tmp_path), env={})
    c = RolloutController(config, open_store(config.rollout.state, initial_state(config)))
    try:
        with pytest.raises(GatesRefused):
            c.set_percent(10)
        assert c.history() == []
    finally:
        c.store.close()


def test_the_history_names_every_cohort_unless_one_is_asked(ctl: RolloutController) -> None:
    ctl.set_percent(10, cohort="m")
    ctl.set_percent(5, cohort="beta")
    assert [e.cohort for e in ctl.history()] == ["m", "beta"]
    assert [e.cohort for e in ctl.history(cohort="m")] == ["m"]
    assert len(ctl.history(limit=1)) == 1


def test_a_change_without_a_reason_records_none(ctl: RolloutController) -> None:
    assert ctl.set_percent(10, cohort="m").event.reason == ""
    assert ctl.set_mode("shadow", cohort="m").event.reason == ""
    ctl.set_mode("split", cohort="m")
    back = ctl.rollback(cohort="m", actor="ops")
    assert back.event.reason == ""
    assert (back.state.updated_by, back.event.actor) == ("ops", "ops")
    again = ctl.set_percent(0, cohort="m")
    assert (again.changed, again.event.forced) == (False, False)
    assert again.event.forced is False


def test_a_rollback_from_one_percent(ctl: RolloutController) -> None:
    ctl.set_percent(1, cohort="m")
    assert ctl.rollback(cohort="m").state.percent == 0.0


def test_every_status_reads_its_own_cohorts_state_steps_and_evidence(
    ctl: RolloutController,
) -> None:
    ctl.set_percent(10, cohort="m", candidate="fp8")
    ctl.set_percent(5, cohort="beta")
    statuses = {s.cohort: s for s in ctl.statuses()}
    assert (
        statuses["m"].state.percent,
        statuses["m"].state.candidate,
        statuses["m"].candidate,
    ) == (10.0, "fp8", "fp8")
    assert (statuses["beta"].state.percent, statuses["beta"].next_step) == (5.0, 25.0)
    assert (statuses["other"].state.percent, statuses["other"].next_step) == (0.0, 10.0)
    assert ctl.status("beta").next_step == 25.0
    m = statuses["m"]
    assert [(c.backend, c.serving) for c in m.candidates] == [("bf16", False), ("fp8", True)]
    for candidate in m.candidates:
        assert [g.verdict for g in candidate.gates if g.name in ("traffic", "error_rate")] == [
            "passed",
            "passed",
        ]
    error = next(d for d in m.comparisons if d.measure == "error_rate")
    assert error.detail.startswith("bf16 1.00% - fp8 1.00%")
    assert {cohort for _, cohort in evidence(ctl).asked} >= {"m", "beta", "other"}


def test_a_single_candidate_status_reads_its_evidence_for_the_next_step(tmp_path: Path) -> None:
    c = make(tmp_path, ONE)
    try:
        status = c.status()
        assert status.next_step == 10.0
        assert [g.verdict for g in status.gates_for_next_step if g.name == "error_rate"] == [
            "passed"
        ]
        assert evidence(c).asked[-1][1] == "m"
    finally:
        c.store.close()


def test_a_status_past_the_last_step_still_compares_its_candidates(ctl: RolloutController) -> None:
    ctl.set_percent(100, cohort="m")
    evidence(ctl).asked.clear()
    status = ctl.status("m")
    assert status.next_step is None
    assert [c.gates for c in status.candidates] == [[], []]
    assert [cohort for _, cohort in evidence(ctl).asked] == ["m"]
    error = next(d for d in status.comparisons if d.measure == "error_rate")
    assert error.detail.startswith("bf16 1.00% - fp8 1.00%")


def test_a_candidate_without_evidence_waits_in_the_status(ctl: RolloutController) -> None:
    evidence(ctl).windows = {"hosted": GOOD["hosted"], "bf16": GOOD["bf16"]}
    status = ctl.status("m")
    fp8 = next(c for c in status.candidates if c.backend == "fp8")
    assert [g.verdict for g in fp8.gates if g.name == "traffic"] == ["inconclusive"]
    assert all(d.lead == "undecided" for d in status.comparisons)


def test_a_config_without_models_has_the_fleet_wide_cohort(tmp_path: Path) -> None:
    text = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models: []
rollout: {{state: "sqlite:///{tmp}/state.db"}}
"""
    c = make(tmp_path, text)
    try:
        assert [s.cohort for s in c.statuses()] == [""]
        assert c.status().cohort == ""
        with pytest.raises(RolloutError) as caught:
            c.cohort_of("m")
        assert str(caught.value) == "no cohort 'm'; cohorts: none"
    finally:
        c.store.close()


def test_a_missing_candidates_comparisons_still_name_it(ctl: RolloutController) -> None:
    evidence(ctl).windows = {"hosted": GOOD["hosted"], "bf16": GOOD["bf16"]}
    status = ctl.status("m")
    assert {(d.a, d.b) for d in status.comparisons} == {("bf16", "fp8")}
    assert status.steps == [10.0, 50.0, 100.0]
    assert ctl.status("beta").steps == [5.0, 25.0]


SLOW = BackendWindow(
    "bf16", requests=4000, conversations=400, errors=1200, ttft_p50=0.5, ttft_p95=5.0,
    ttft_sample=(5.0,) * 4000,
)  # fmt: skip


def test_a_refusal_lists_every_failing_gate(ctl: RolloutController) -> None:
    evidence(ctl).windows = GOOD | {"bf16": SLOW}
    with pytest.raises(GatesRefused) as caught:
        ctl.set_percent(10, cohort="m")
    message = str(caught.value)
    assert "error_rate failed: candidate 30.00% - primary 1.00%" in message
    assert "; ttft_p95 failed: candidate TTFT p95 5000 ms" in message
    assert [r.name for r in caught.value.results] == ["traffic", "error_rate", "ttft_p95"]


def test_the_gates_judge_the_candidate_the_cohort_serves(ctl: RolloutController) -> None:
    evidence(ctl).windows = GOOD | {"fp8": SLOW}
    ctl.set_percent(0, cohort="m", candidate="fp8")
    verdicts = {g.name: g.verdict for g in ctl.evaluate(cohort="m")}
    assert verdicts["error_rate"] == "failed"
    assert {g.name: g.verdict for g in ctl.evaluate(cohort="m", candidate="bf16")}[
        "error_rate"
    ] == "passed"


def test_switching_away_from_one_percent_is_refused(ctl: RolloutController) -> None:
    ctl.set_percent(1, cohort="m")
    with pytest.raises(RolloutError, match=r"^bf16 serves 1% of m: set it to 0%"):
        ctl.set_percent(1, cohort="m", candidate="fp8")


def test_changes_without_an_actor_are_the_clis(ctl: RolloutController) -> None:
    assert ctl.set_percent(10, cohort="m").event.actor == "cli"
    assert ctl.set_mode("shadow", cohort="m").event.actor == "cli"
    ctl.set_mode("split", cohort="m")
    assert ctl.rollback(cohort="m").event.actor == "cli"


def test_the_history_shows_the_last_100_changes_unless_asked(ctl: RolloutController) -> None:
    for i in range(101):
        ctl.change(float(i % 2 + 1), "shadow", cohort="m")
    assert len(ctl.history()) == 100
    assert len(ctl.history(limit=101)) == 101


def test_a_change_through_change_has_the_same_defaults(ctl: RolloutController) -> None:
    outcome = ctl.change(10.0, cohort="m")
    assert (outcome.event.reason, outcome.event.actor) == ("", "cli")
    # no candidate named: the state keeps no choice of its own
    assert (outcome.state.candidate, outcome.event.candidate) == ("", "")


def test_observe_mode_refuses_every_change(tmp_path: Path) -> None:
    c = make(tmp_path, mode="observe")
    try:
        with pytest.raises(RolloutError) as caught:
            c.set_percent(10, cohort="m")
        assert str(caught.value) == (
            "rollout.mode is observe: the primary is measured alone and there is no candidate "
            "to roll out to. Name a candidate (rollout.candidate) and set rollout.mode: shadow "
            "to start a pilot"
        )
    finally:
        c.store.close()


def test_lowering_the_share_keeps_the_good_step(ctl: RolloutController) -> None:
    ctl.set_percent(10, cohort="m")
    ctl.set_percent(50, cohort="m")  # vouched at 10%: the good step is 10
    lowered = ctl.set_percent(30, cohort="m")
    assert lowered.state.last_good_percent == 10.0
    assert ctl.rollback(cohort="m").state.percent == 10.0


def test_a_forced_step_does_not_become_the_good_step(ctl: RolloutController) -> None:
    ctl.set_percent(10, cohort="m")
    ctl.set_percent(50, cohort="m")
    evidence(ctl).windows = BAD
    forced = ctl.set_percent(100, cohort="m", force=True)
    assert (forced.event.forced, forced.state.last_good_percent) == (True, 10.0)
    assert ctl.rollback(cohort="m").state.percent == 10.0


def test_two_cohorts_need_a_name(tmp_path: Path) -> None:
    text = ONE.replace("models:\n", "models:\n  - {{model_name: n, hosted: n, bf16: n}}\n")
    c = make(tmp_path, text)
    try:
        with pytest.raises(RolloutError) as caught:
            c.cohort_of()
        assert str(caught.value) == (
            "this config has 2 cohorts; name one with --model or --cohort: n, m"
        )
    finally:
        c.store.close()
