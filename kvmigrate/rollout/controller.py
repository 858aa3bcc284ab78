"""Rollout changes with their checks: promote through gates, roll back, record why.

The CLI (against the store directly) and the proxy's /admin/rollout API both go through
this class, so a change is checked and recorded the same way whoever makes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvmigrate.config import Config, safe_url
from kvmigrate.logtext import quoted
from kvmigrate.policies import Mode
from kvmigrate.policies.candidate_compare import PairDifference, compare_candidates
from kvmigrate.policies.gates import GateResult, Verdict, all_passed, evaluate_gates, gates_left_off
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.state import Action, RolloutEvent, RolloutState
from kvmigrate.rollout.store import RolloutStore

# Evidence for the gates: per-backend figures of a cohort's traffic recorded since a time
# (cohort "": all traffic).
WindowSource = Callable[[float, str], dict[str, BackendWindow]]
# What a change says about itself is kept in the state store with every event and sent
# back by the history: a reason is a sentence and an actor a name, not documents.
REASON_MAX_CHARS = 1000
ACTOR_MAX_CHARS = 200


class RolloutError(Exception):
    """A change that was refused before anything was written."""


class NoteTooLong(RolloutError, ValueError):
    """A reason or an actor longer than the history keeps. Refused rather than cut: a
    reason cut short can say something the whole did not."""

    def __init__(self, field: str, limit: int) -> None:
        super().__init__(f"{field} must be a string of at most {limit} characters")
        self.field = field


def check_notes(reason: str, actor: str) -> None:
    """Refuse a reason or an actor over its limit; the message names the field, never the
    value."""
    if len(reason) > REASON_MAX_CHARS:
        raise NoteTooLong("reason", REASON_MAX_CHARS)
    if len(actor) > ACTOR_MAX_CHARS:
        raise NoteTooLong("actor", ACTOR_MAX_CHARS)


class StateChanged(RolloutError):
    """The state is no longer the one the caller saw (`expected_version`)."""


class _Unchanged(Exception):
    """A change to where the rollout already is: raised inside the store's transaction so
    that nothing is written."""

    def __init__(self, state: RolloutState) -> None:
        super().__init__("unchanged")
        self.state = state


class GatesRefused(RolloutError):
    def __init__(self, target: float, results: list[GateResult]) -> None:
        failing = [r for r in results if r.verdict != Verdict.PASSED]
        reasons = "; ".join(f"{r.name} {r.verdict}: {r.detail}" for r in failing)
        super().__init__(
            f"promotion to {target:g}% refused by the gates: {reasons}. "
            "Use --force to override (the override is recorded)."
        )
        self.target = target
        self.results = results


@dataclass(frozen=True, slots=True)
class ChangeOutcome:
    state: RolloutState
    event: RolloutEvent
    gates: list[GateResult] = field(default_factory=list)
    # False: the rollout already was where the change asked; nothing was written, and
    # `event` (its version the current one) only describes the state.
    changed: bool = True


@dataclass(frozen=True, slots=True)
class CandidateGates:
    """One candidate of a cohort, judged on its own traffic (its shadow copies, or what it
    served) against the primary: what the next step's gates would say if it served."""

    backend: str
    serving: bool  # the one the cohort's split gives its share to
    gates: list[GateResult]


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    """Where the rollout stands, and what the next step's gates say."""

    state: RolloutState
    steps: list[float]
    next_step: float | None
    gates_for_next_step: list[GateResult]
    store: str  # its URL, without a password
    cohort: str = ""  # "": the fleet-wide default (a config without models)
    candidate: str = ""  # the backend a split gives the share to
    # Every candidate of the cohort with its own gates (the serving one's are
    # gates_for_next_step), and with several, each pair against each other.
    candidates: list[CandidateGates] = field(default_factory=list)
    comparisons: list[PairDifference] = field(default_factory=list)
    # The optional gates the config leaves off, by name, with the key that turns each on:
    # a gate that is off never holds a step back, so a reader must see that it is off.
    gates_off: dict[str, str] = field(default_factory=dict)


def initial_state(config: Config) -> RolloutState:
    """The state before any change: the config's. It has no time of its own (0), so the
    gates look back over the whole window rather than from the moment it was read."""
    r = config.rollout
    return RolloutState(mode=Mode(r.mode), percent=r.percent, updated_at=0.0, updated_by="config")


class RolloutController:
    def __init__(
        self, config: Config, store: RolloutStore, windows: WindowSource | None = None
    ) -> None:
        self.config = config
        self.store = store
        self.windows = windows

    def cohort_of(self, selector: str | None = None) -> str:
        """The cohort a change or a question is about: the one named, or the config's only
        one. Several and none named: refused, listing them, so no change lands by accident."""
        names = self.config.cohort_names()
        if selector is None:
            if len(names) > 1:
                raise RolloutError(
                    f"this config has {len(names)} cohorts; name one with --model or --cohort: "
                    + ", ".join(names)
                )
            return names[0] if names else ""
        if selector not in names:
            raise RolloutError(
                f"no cohort {quoted(selector)}; cohorts: {', '.join(names) or 'none'}"
            )
        return selector

    def read(self, cohort: str | None = None) -> RolloutState:
        return self._read(self.cohort_of(cohort))

    def _read(self, name: str) -> RolloutState:
        return self._as_configured(self.store.read(name), name)

    def _as_configured(self, state: RolloutState, name: str) -> RolloutState:
        """The stored state under the config's candidates now (`RolloutState.of_candidates`):
        what the proxies route by, so what the gates and changes start from."""
        return state.of_candidates(self.config.candidates_of(name))

    def evaluate(
        self,
        state: RolloutState | None = None,
        cohort: str | None = None,
        candidate: str | None = None,
    ) -> list[GateResult]:
        """The gates over the cohort's own evidence gathered since its last change (within
        the window): a cohort is judged on its traffic alone, and on the candidate its
        split serves (or `candidate`) against the primary."""
        name = self.cohort_of(cohort)
        state = state or self._read(name)
        found = self._evidence(state, name)
        return self._gates(found, candidate or self.serving(state, name))

    def _evidence(self, state: RolloutState, cohort: str) -> dict[str, BackendWindow]:
        """Each backend's window of the cohort's traffic since its last change."""
        since = max(time.time() - self.config.rollout.gates.window_seconds, state.updated_at)
        return self.windows(since, cohort) if self.windows else {}

    def _gates(self, found: dict[str, BackendWindow], candidate: str) -> list[GateResult]:
        primary = self.config.rollout.primary
        return evaluate_gates(
            found.get(primary, BackendWindow(primary)),
            found.get(candidate, BackendWindow(candidate)),
            self.config.rollout.gates,
        )

    def serving(self, state: RolloutState, cohort: str) -> str:
        """The candidate the cohort's split gives its share to."""
        candidates = self.config.candidates_of(cohort)
        return state.candidate if state.candidate in candidates else candidates[0]

    def _choose(self, candidate: str | None, state: RolloutState, cohort: str) -> str:
        """The candidate a change leaves serving; only one serves a cohort at a time, so
        switching waits until the current one serves nothing."""
        serving = self.serving(state, cohort)
        if candidate is None or candidate == serving:
            return serving
        candidates = self.config.candidates_of(cohort)
        if candidate not in candidates:
            raise RolloutError(
                f"{quoted(candidate)} is not a candidate of {cohort}; its: " + ", ".join(candidates)
            )
        if state.mode == Mode.SPLIT and state.percent > 0:
            raise RolloutError(
                f"{serving} serves {state.percent:g}% of {cohort}: set it to 0% (or roll back) "
                f"before switching to {candidate}"
            )
        return candidate

    def set_percent(
        self,
        percent: float,
        reason: str = "",
        actor: str = "cli",
        force: bool = False,
        cohort: str | None = None,
        candidate: str | None = None,
        expected_version: int | None = None,
    ) -> ChangeOutcome:
        """Move the candidate's share. Raising it is a promotion: the gates must pass.
        `candidate`: which of the cohort's candidates the share goes to."""
        return self.change(percent, None, reason, actor, force, cohort, candidate, expected_version)

    def set_mode(
        self,
        mode: str,
        reason: str = "",
        actor: str = "cli",
        cohort: str | None = None,
        force: bool = False,
    ) -> ChangeOutcome:
        """Switch the mode; a split of a share kept in shadow mode is a promotion."""
        return self.change(None, mode, reason, actor, force, cohort)

    def change(
        self,
        percent: float | None = None,
        mode: str | None = None,
        reason: str = "",
        actor: str = "cli",
        force: bool = False,
        cohort: str | None = None,
        candidate: str | None = None,
        expected_version: int | None = None,
    ) -> ChangeOutcome:
        """Move the share and/or switch the mode, as one change written at once. Whatever
        raises the share the candidate serves is a promotion, judged by the gates on the
        evidence gathered before it. A change to where the rollout already is writes
        nothing: an event would restart the gates' evidence window for no reason.
        `expected_version`: refuse unless the state is still the one the caller saw (what
        `rollout auto` last looked at), so a rollback made meanwhile is never overridden."""
        check_notes(reason, actor)
        percent, target = _checked(percent, mode)
        name = self.cohort_of(cohort)
        current = self._read(name)
        _expect(current, expected_version)
        chosen = self._choose(candidate, current, name)
        promoting = _raises_share(current, *_target(current, target, percent))
        results = self.evaluate(current, name, chosen) if promoting else []
        passed = all_passed(results)
        if promoting and not passed and not force:
            raise GatesRefused(effective_share(*_target(current, target, percent)), results)

        def change(stored: RolloutState) -> tuple[RolloutState, RolloutEvent]:
            state = self._as_configured(stored, name)
            _expect(state, expected_version)
            new_mode, new_percent = _target(state, target, percent)
            raising = _raises_share(state, new_mode, new_percent)
            if raising and not force and state.version != current.version:
                raise RolloutError("the rollout changed while the gates were evaluated; retry")
            switched = self._choose(candidate, state, name) != self.serving(state, name)
            if (new_mode, new_percent) == (state.mode, state.percent) and not switched:
                raise _Unchanged(state)
            # the gates passed on this very state (not one a forced change raced past)
            vouched = promoting and passed and state.version == current.version
            good = 0.0 if switched else state.last_good_percent
            if raising and vouched and state.mode == Mode.SPLIT and not switched:
                good = max(good, state.percent)  # the evidence came from this step
            picked = chosen if candidate is not None else state.candidate
            new = state.next(
                actor, mode=new_mode, percent=new_percent, last_good_percent=good, candidate=picked
            )
            action = (
                Action.PROMOTE if raising else Action.SET if percent is not None else Action.MODE
            )
            forced = raising and not vouched
            return new, _event(state, new, action, actor, reason, forced, results)

        try:
            state, event = self.store.apply(change, name)
        except _Unchanged as unchanged:
            action = Action.SET if percent is not None else Action.MODE
            return _unchanged(unchanged.state, action, actor, reason, name)
        return ChangeOutcome(state, event, results)

    def rollback(
        self,
        reason: str = "",
        actor: str = "cli",
        automatic: bool = False,
        expected_version: int | None = None,
        cohort: str | None = None,
    ) -> ChangeOutcome:
        """Back to the last step whose gates passed, or to 0; candidate pins stop holding.

        `expected_version` makes it conditional: several proxies that see the same breach
        roll back once, not once each. Only the cohort's share moves; the others keep theirs.
        """
        if automatic:  # the proxy's own words: a rollback is never refused for them
            reason, actor = reason[:REASON_MAX_CHARS], actor[:ACTOR_MAX_CHARS]
        check_notes(reason, actor)
        name = self.cohort_of(cohort)
        current = self._read(name)
        if current.mode != Mode.SPLIT or current.percent == 0:
            raise RolloutError("nothing to roll back: the candidate serves no traffic")

        def change(stored: RolloutState) -> tuple[RolloutState, RolloutEvent]:
            state = self._as_configured(stored, name)
            if expected_version is not None and state.version != expected_version:
                raise RolloutError("the rollout changed since the breach was seen")
            if state.mode != Mode.SPLIT or state.percent == 0:
                raise RolloutError("nothing to roll back: the candidate serves no traffic")
            target = state.last_good_percent if state.last_good_percent < state.percent else 0.0
            new = state.next(
                actor,
                percent=target,
                epoch=state.epoch + 1,
                last_good_percent=min(state.last_good_percent, target),
            )
            action = Action.AUTO_ROLLBACK if automatic else Action.ROLLBACK
            return new, _event(state, new, action, actor, reason, False, [])

        state, event = self.store.apply(change, name)
        return ChangeOutcome(state, event)

    def next_step(
        self, state: RolloutState | None = None, cohort: str | None = None
    ) -> float | None:
        name = self.cohort_of(cohort)
        return self._next(state or self._read(name), name)

    def _next(self, state: RolloutState, cohort: str) -> float | None:
        current = effective_share(state.mode, state.percent)
        return next((s for s in self.config.steps_of(cohort) if s > current), None)

    def status(self, cohort: str | None = None) -> RolloutStatus:
        name = self.cohort_of(cohort)
        return self._status(name, self._read(name))

    def statuses(self) -> list[RolloutStatus]:
        """Every cohort's status, in the config's order, from one read of the store."""
        states = self.store.read_all()
        names = self.config.cohort_names() or ("",)
        return [self._status(name, self._as_configured(states.of(name), name)) for name in names]

    def history(self, limit: int = 100, cohort: str | None = None) -> list[RolloutEvent]:
        """Every cohort's changes when none is named (even on a config of several)."""
        return self.store.history(limit, None if cohort is None else self.cohort_of(cohort))

    def _status(self, name: str, state: RolloutState) -> RolloutStatus:
        """The next step's gates for every candidate of the cohort, each on its own
        traffic, and with several, how they compare: from one read of the evidence."""
        step = self._next(state, name)
        serving = self.serving(state, name)
        backends = self.config.candidates_of(name)
        found = self._evidence(state, name) if step or len(backends) > 1 else {}
        candidates = [
            CandidateGates(b, b == serving, self._gates(found, b) if step else []) for b in backends
        ]
        windows = [found.get(b, BackendWindow(b)) for b in backends]
        return RolloutStatus(
            state=state,
            steps=list(self.config.steps_of(name)),
            next_step=step,
            gates_for_next_step=next(c.gates for c in candidates if c.serving),
            store=safe_url(self.store.url),
            cohort=name,
            candidate=serving,
            candidates=candidates,
            comparisons=compare_candidates(windows, self.config.rollout.gates),
            gates_off=gates_left_off(self.config.rollout.gates),
        )


def effective_share(mode: Mode, percent: float) -> float:
    """The share of conversations the candidate serves: none in shadow mode, whatever
    percent the state keeps for a later split."""
    return percent if mode == Mode.SPLIT else 0.0


def _checked(percent: float | None, mode: str | None) -> tuple[float | None, Mode | None]:
    """The change's percent and mode, refused before anything is read when out of range."""
    if percent is None and mode is None:
        raise RolloutError("give a percent or a mode")
    if percent is not None and not 0 <= percent <= 100:  # NaN fails both comparisons
        raise RolloutError(f"percent must be between 0 and 100, got {percent:g}")
    if mode is not None and mode not in tuple(Mode):
        raise RolloutError(f"mode must be shadow or split, got {quoted(mode)}")
    # -0 would be stored and shown as "-0%"
    return (0.0 if percent == 0 else percent), (None if mode is None else Mode(mode))


def _target(state: RolloutState, mode: Mode | None, percent: float | None) -> tuple[Mode, float]:
    """Where a change leaves the rollout. A percent alone above 0 means a split (as
    `--percent 10` always has); a mode alone keeps the percent."""
    new_percent = state.percent if percent is None else percent
    if mode is not None:
        return mode, new_percent
    return (Mode.SPLIT if new_percent > 0 else state.mode), new_percent


def _raises_share(state: RolloutState, mode: Mode, percent: float) -> bool:
    """A promotion: the candidate would serve more than it does (a split of a share kept
    in shadow mode is one, as much as a larger percent)."""
    return effective_share(mode, percent) > effective_share(state.mode, state.percent)


def _expect(state: RolloutState, expected_version: int | None) -> None:
    if expected_version is not None and state.version != expected_version:
        raise StateChanged(
            f"the rollout changed since version {expected_version} "
            f"(now version {state.version}: {state.mode} {state.percent:g}%)"
        )


def _unchanged(
    state: RolloutState, action: Action, actor: str, reason: str, cohort: str
) -> ChangeOutcome:
    """What a change to where the rollout already is answers: the state as it stands,
    described by an event that was not written."""
    event = _event(state, state, action, actor, reason, False, [])
    return ChangeOutcome(state, replace(event, cohort=cohort), changed=False)


def _event(
    old: RolloutState,
    new: RolloutState,
    action: Action,
    actor: str,
    reason: str,
    forced: bool,
    gates: list[GateResult],
) -> RolloutEvent:
    return RolloutEvent(
        candidate=new.candidate,
        at=new.updated_at,
        actor=actor,
        action=action,
        from_mode=old.mode,
        to_mode=new.mode,
        from_percent=old.percent,
        to_percent=new.percent,
        reason=reason,
        forced=forced,
        gates=[g.to_dict() for g in gates],
        version=new.version,
    )
