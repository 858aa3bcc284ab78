"""Where the proxy's routing state comes from: the config file alone, or a live store."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from kvmigrate.config import Config
from kvmigrate.policies import RolloutSnapshot, Route, route
from kvmigrate.rollout.state import RolloutState


class RolloutSource(Protocol):
    def current(self, cohort: str = "") -> RolloutSnapshot:
        """The cohort's snapshot (the default rollout's for "" or a cohort it does not know)."""
        ...

    async def route(
        self, conversation: str, turn: int, served: Collection[str], cohort: str = ""
    ) -> Route:
        """Route one request of `conversation` (`policies.route`, with the state the source
        keeps: the cohort's snapshot and the conversation's pin)."""
        ...


class StaticRollout:
    """The rollout as the config file sets it, without pins: each cohort with its own
    candidates (models[].candidates), so every one of them gets its shadow copy."""

    def __init__(self, config: Config) -> None:
        r = config.rollout
        state = RolloutState.from_config(r)
        self._snapshot = state.snapshot(r)
        self._cohorts = {
            name: state.snapshot(r, config.candidates_of(name)) for name in config.cohort_names()
        }

    def current(self, cohort: str = "") -> RolloutSnapshot:
        return self._cohorts.get(cohort, self._snapshot)

    async def route(
        self, conversation: str, turn: int, served: Collection[str], cohort: str = ""
    ) -> Route:
        return route(conversation, self._cohorts.get(cohort, self._snapshot), served)
