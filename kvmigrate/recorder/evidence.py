"""The rollout controller a config describes: its store, with the recorded traffic as the
gates' evidence.

Here, above the rollout, which knows nothing of the recorder (the controller takes its
evidence as a `WindowSource`). Kept apart from `kvmigrate.runtime` (the proxy's wiring) so
that `kvmigrate rollout` loads neither the proxy nor aiohttp; the queries load when a gate
first asks.
"""

from __future__ import annotations

from kvmigrate.config import Config, safe_url
from kvmigrate.policies.window import BackendWindow
from kvmigrate.rollout.controller import RolloutController, WindowSource, initial_state
from kvmigrate.rollout.store import StoreError, open_store


def records_window_source(config: Config) -> WindowSource:
    """Gate evidence from the records database the proxies write (`record.db`)."""

    def windows(since: float, cohort: str) -> dict[str, BackendWindow]:
        """The cohort's own traffic ("": all of it)."""
        from kvmigrate.recorder.queries import window_stats
        from kvmigrate.recorder.sqlite_store import nothing_recorded
        from kvmigrate.recorder.store import StoreError as RecordsError
        from kvmigrate.recorder.store import database_errors

        db = config.record.db
        try:
            if nothing_recorded(db):
                # No proxy has written yet (or recording is off): no evidence, and no empty
                # database left behind where the operator only asked for a status.
                return {}
            return window_stats(db, since, cohort=cohort, model=config.own_model(cohort))
        except database_errors() as exc:
            # As the rollout store's own error: the CLI says it in one line and the admin
            # API answers 503, where a driver's exception was a traceback or a bare 500.
            detail = " ".join(str(exc).split())
            if not isinstance(exc, RecordsError):  # those already name the database
                detail = f"records database {safe_url(db)}: {detail}"
            raise StoreError(f"the gates' evidence: {detail}") from None

    return windows


def open_controller(config: Config) -> RolloutController:
    """A controller over the configured store, with the recorded traffic as evidence."""
    store = open_store(config.rollout.state, initial_state(config))
    return RolloutController(config, store, records_window_source(config))
