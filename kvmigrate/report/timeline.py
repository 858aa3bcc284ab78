"""The rollout timeline of a report, read from the rollout store's audit trail."""

from __future__ import annotations

import logging

from kvmigrate.config import Config
from kvmigrate.policies import Mode
from kvmigrate.policies.gates import gate_summary
from kvmigrate.report.model import TimelineEvent
from kvmigrate.rollout.controller import initial_state
from kvmigrate.rollout.sqlite_store import sqlite_path
from kvmigrate.rollout.store import StoreError, UnreadableState, open_store

log = logging.getLogger("kvmigrate.report")


def rollout_timeline(config: Config, since: float, until: float) -> list[TimelineEvent]:
    """Every rollout change in [since, until); empty when no store exists yet or it is down
    (a report must still render without its timeline)."""
    url = config.rollout.state
    if url.startswith("sqlite") and not sqlite_path(url).exists():
        return []
    try:
        store = open_store(url, initial_state(config))
        try:
            events = store.history(10_000)
        finally:
            store.close()
    except (StoreError, UnreadableState) as exc:
        log.warning("rollout timeline unavailable: %s", exc)
        return []
    timeline = []
    for e in events:
        if not since <= e.at < until:
            continue
        percent = e.to_percent if e.to_mode == Mode.SPLIT else 0.0
        detail = f"{e.from_mode} {e.from_percent:g}% -> {e.to_mode} {e.to_percent:g}% by {e.actor}"
        if e.forced:
            detail += " (forced past the gates)"
        if e.reason:
            detail += f": {e.reason}"
        if e.gates:
            detail += f"; gates: {gate_summary(e.gates)}"
        timeline.append(TimelineEvent(e.at, e.action, detail, percent, e.cohort))
    return timeline
