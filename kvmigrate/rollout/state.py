"""The rollout state as stored: plain values that every store serialises the same way."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from kvmigrate.config import RolloutConfig
from kvmigrate.policies import Mode, RolloutSnapshot


class Action(StrEnum):
    """What a change to the rollout did, as the audit trail records it."""

    PROMOTE = "promote"  # a larger share for the candidate, through the gates
    SET = "set"  # a share set without promoting (lowered, or to where it is)
    MODE = "mode"
    ROLLBACK = "rollback"
    AUTO_ROLLBACK = "auto-rollback"
    INIT = "init"


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Where the rollout stands. `version` grows by one with every change, which is how
    running proxies notice a change and how concurrent writers detect a race.

    `last_good_percent` is the last split percent whose gates passed (or that an operator
    forced), the step a rollback returns to. `epoch` grows with every rollback: a pin to the
    candidate made in an older epoch no longer holds, so a rollback really moves
    conversations off a bad candidate.
    """

    mode: Mode = Mode.SHADOW
    percent: float = 0.0
    version: int = 0
    epoch: int = 0
    last_good_percent: float = 0.0
    updated_at: float = 0.0
    updated_by: str = ""
    # The candidate a split serves, chosen by `rollout --candidate`; "": the cohort's first.
    candidate: str = ""

    @classmethod
    def from_config(cls, rollout: RolloutConfig) -> RolloutState:
        """The state the config file seeds, before any `kvmigrate rollout` change."""
        return cls(mode=Mode(rollout.mode), percent=rollout.percent)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.candidate:
            del data["candidate"]  # a state without a choice reads back as it was written
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutState:
        return cls(
            mode=Mode(data.get("mode", Mode.SHADOW)),
            percent=float(data.get("percent", 0.0)),
            version=int(data.get("version", 0)),
            epoch=int(data.get("epoch", 0)),
            last_good_percent=float(data.get("last_good_percent", 0.0)),
            updated_at=float(data.get("updated_at", 0.0)),
            updated_by=str(data.get("updated_by", "")),
            candidate=str(data.get("candidate", "")),
        )

    def next(self, actor: str, **changes: Any) -> RolloutState:
        return replace(
            self, version=self.version + 1, updated_at=time.time(), updated_by=actor, **changes
        )

    def of_candidates(self, candidates: tuple[str, ...]) -> RolloutState:
        """This state as it stands for a cohort whose candidates are now `candidates`. A
        share given to a candidate the config no longer lists (removed, or its backend
        renamed) is no one's: handing it to the first candidate would promote a backend no
        gate judged, so it reads as 0%, with no good step to roll back to."""
        if not self.candidate or self.candidate in candidates:
            return self
        return replace(self, percent=0.0, last_good_percent=0.0, candidate="")

    def snapshot(self, rollout: RolloutConfig, candidates: tuple[str, ...] = ()) -> RolloutSnapshot:
        """What the proxy routes by: this state, under the config's fixed rollout settings.
        `candidates`: the cohort's candidate backends; the one not serving get shadow copies."""
        candidates = candidates or (rollout.candidate,)
        state = self.of_candidates(candidates)
        chosen = state.candidate or candidates[0]
        return RolloutSnapshot(
            primary=rollout.primary,
            candidate=chosen,
            extra_shadows=tuple(c for c in candidates if c != chosen),
            # Observe is the config's word: no stored state of an earlier pilot overrides it.
            mode=Mode.OBSERVE if rollout.mode == Mode.OBSERVE else state.mode,
            percent=state.percent,
            shadow_sample=rollout.shadow_sample,
            salt=rollout.salt,
            fallback=rollout.fallback,
            noise_sample=rollout.noise_sample,
            epoch=self.epoch,
        )


@dataclass(frozen=True, slots=True)
class RolloutEvent:
    """One entry of the audit trail: who changed what, why, and what the gates said."""

    at: float
    actor: str
    action: Action
    from_mode: Mode
    to_mode: Mode
    from_percent: float
    to_percent: float
    reason: str = ""
    forced: bool = False
    gates: list[dict[str, Any]] = field(default_factory=list)
    version: int = 0
    # The cohort it changed; "" for the fleet-wide default (every event before cohorts).
    cohort: str = ""
    # The candidate chosen by `rollout --candidate` when the change was made ("": none).
    candidate: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("cohort", "candidate"):
            if not data[name]:
                del data[name]  # a fleet-wide event reads back as it was written before
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutEvent:
        return cls(
            at=float(data["at"]),
            actor=str(data["actor"]),
            action=Action(data["action"]),
            from_mode=Mode(data["from_mode"]),
            to_mode=Mode(data["to_mode"]),
            from_percent=float(data["from_percent"]),
            to_percent=float(data["to_percent"]),
            reason=str(data.get("reason", "")),
            forced=bool(data.get("forced", False)),
            gates=list(data.get("gates", [])),
            version=int(data.get("version", 0)),
            cohort=str(data.get("cohort", "")),
            candidate=str(data.get("candidate", "")),
        )


@dataclass(frozen=True, slots=True)
class CohortStates:
    """Every stored state at once: the fleet-wide default (the whole state before cohorts
    existed) and the cohorts that have one of their own. A cohort without its own follows
    the default, so a store written before cohorts moves nothing when it is upgraded."""

    default: RolloutState
    own: dict[str, RolloutState] = field(default_factory=dict)

    def of(self, cohort: str) -> RolloutState:
        return self.own.get(cohort, self.default)


@dataclass(frozen=True, slots=True)
class Pin:
    """A conversation held on the backend that served its first turn."""

    conversation: str
    backend: str
    epoch: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class Link:
    """Something a later request will name, mapped to the conversation and turn it belongs to.

    `key` is namespaced by kind: `c:<digest>` for a history and its answer (continuity);
    `r:<response id>` and `v:<conversation id>` for Responses API chains
    (kvmigrate.continuity.chains). `detail` is free text for what a kind needs besides (a chain's
    backend and the candidate's own response id, as a JSON pair; with several candidates a
    third item maps each to its own id).
    """

    key: str
    conversation: str
    turn: int
    expires_at: float
    detail: str = ""
