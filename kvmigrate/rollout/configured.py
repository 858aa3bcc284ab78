"""The rollout controller a config describes: its store, with the recorded traffic as the
gates' evidence.

Kept apart from `kvmigrate.runtime` (the proxy's wiring) so that `kvmigrate rollout`
loads neither the proxy nor aiohttp.
"""

from __future__ import annotations

from kvmigrate.config import Config
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.controller import RolloutController, WindowSource, initial_state
from kvmigrate.rollout.store import open_store


def records_window_source(config: Config) -> WindowSource:
    """Gate evidence from the records database the proxies write (`record.db`)."""

    def windows(since: float, cohort: str) -> dict[str, BackendWindow]:
        """The cohort's own traffic ("": all of it)."""
        from kvmigrate.recorder.queries import window_stats

        db = config.record.db
        return window_stats(db, since, cohort=cohort, model=config.own_model(cohort))

    return windows


def open_controller(config: Config) -> RolloutController:
    """A controller over the configured store, with the recorded traffic as evidence."""
    store = open_store(config.rollout.state, initial_state(config))
    return RolloutController(config, store, records_window_source(config))
