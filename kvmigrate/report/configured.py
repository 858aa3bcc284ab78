"""The report a config asks for: its primary and candidate, its cohorts, its rollout's
timeline and its GPU scrape, so `kvmigrate report` and the demo build the same one."""

from __future__ import annotations

from kvmigrate.config import Config
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report.build import build_report
from kvmigrate.report.gpu import ScrapeSetup
from kvmigrate.report.model import Prices, Report
from kvmigrate.report.timeline import rollout_timeline


def configured_report(
    config: Config,
    store: RecordStore | None,
    since: float,
    until: float,
    prices: Prices | None = None,
    max_turn: int = 10,
) -> Report:
    r = config.rollout
    return build_report(
        store,
        since,
        until,
        primary=r.primary,
        candidate=r.candidate,
        prices=prices,
        timeline=rollout_timeline(config, since, until),
        database=config.record.db,
        max_turn=max_turn,
        candidates_of={name: config.candidates_of(name) for name in config.cohort_names()},
        gpu=ScrapeSetup.of(config),
    )
