"""Modes, actions and roles are StrEnums: what the stores hold, and the JSON the CLI and
the admin API print, are the same strings as before, and what was stored before reads back."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import orjson

from kvmigrate.exchange import SHADOW, Exchange, Role
from kvmigrate.policies import Mode
from kvmigrate.recorder.convert import to_record
from kvmigrate.rollout.state import Action, RolloutEvent, RolloutState
from kvmigrate.rollout.store import open_store

# A state and an event as the stores held them when these fields were plain strings.
STATE_BEFORE = (
    '{"mode": "split", "percent": 10.0, "version": 3, "epoch": 1, "last_good_percent": 0.0, '
    '"updated_at": 5.0, "updated_by": "cli"}'
)
EVENT_BEFORE = (
    '{"at": 5.0, "actor": "cli", "action": "auto-rollback", "from_mode": "split", '
    '"to_mode": "split", "from_percent": 50.0, "to_percent": 10.0, "reason": "ttft", '
    '"forced": false, "gates": [], "version": 3}'
)


def test_stored_state_and_events_read_back_and_write_the_same_json() -> None:
    state = RolloutState.from_dict(json.loads(STATE_BEFORE))
    event = RolloutEvent.from_dict(json.loads(EVENT_BEFORE))
    assert state.mode is Mode.SPLIT
    assert event.action is Action.AUTO_ROLLBACK
    assert event.from_mode is Mode.SPLIT
    assert json.dumps(state.to_dict()) == STATE_BEFORE
    assert json.dumps(event.to_dict()) == EVENT_BEFORE
    assert orjson.loads(orjson.dumps(state.to_dict())) == json.loads(STATE_BEFORE)


def test_a_sqlite_store_holds_plain_strings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    store = open_store(url, RolloutState())
    try:

        def change(old: RolloutState) -> tuple[RolloutState, RolloutEvent]:
            new = old.next("cli", mode=Mode.SPLIT, percent=10.0)
            event = RolloutEvent(new.updated_at, "cli", Action.PROMOTE, old.mode, new.mode, 0, 10)
            return new, event

        store.apply(change)
        assert store.read().mode == "split"
        [event] = store.history()
        assert (event.action, event.from_mode, event.to_mode) == ("promote", "shadow", "split")
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "state.db") as db:
        [(state_json,)] = db.execute("SELECT data FROM rollout_state").fetchall()
        [(event_json,)] = db.execute("SELECT data FROM rollout_history").fetchall()
    assert '"mode": "split"' in state_json
    assert '"action": "promote", "from_mode": "shadow", "to_mode": "split"' in event_json


def test_a_record_holds_the_role_as_a_plain_string() -> None:
    x = Exchange("r", "chat/completions", "vllm", SHADOW, "m", "m", "c", 1, False, 0.0)
    x.status, x.finished, x.chunks = 200, 0.1, [b'{"choices": []}']
    record = to_record(x, 0.0, "none", "test")
    assert type(record.role) is str
    assert record.role == "shadow" == Role.SHADOW
