"""The SQLite rollout store's schema goes through named, append-only migrations, recorded in
`rollout_migrations` by the runner the records store uses (kvmigrate.sql_migrations).

Each store shape an earlier release wrote is built here with that release's exact DDL (from
`git log -p kvmigrate/rollout/sqlite_store.py`), filled, and opened by this code: every row
survives, keys written in the clear come out hashed, and the migrations are recorded.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kvmigrate.policies import Mode
from kvmigrate.recorder import open_store as open_records
from kvmigrate.recorder.schema import MIGRATIONS as RECORD_MIGRATIONS
from kvmigrate.rollout.keys import StoreKeys, is_hashed
from kvmigrate.rollout.schema import MIGRATIONS
from kvmigrate.rollout.sqlite_store import SqliteRolloutStore
from kvmigrate.rollout.state import Link, Pin, RolloutEvent, RolloutState
from kvmigrate.rollout.store import Change

NAMES = [m.name for m in MIGRATIONS]
SEED = RolloutState(version=0)

# c4a06ac: the first release (one state, its history, pins).
ROUND0_DDL = """
CREATE TABLE IF NOT EXISTS rollout_state (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL,
                                          version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rollout_history (version INTEGER PRIMARY KEY, at REAL NOT NULL,
                                            data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollout_pins (conversation TEXT PRIMARY KEY, backend TEXT NOT NULL,
                                         epoch INTEGER NOT NULL, expires_at REAL NOT NULL);
"""
# b9b3030: conversation links (round 1, before cohorts).
LINKS_DDL = """
CREATE TABLE IF NOT EXISTS rollout_links (key TEXT PRIMARY KEY, conversation TEXT NOT NULL,
                                          turn INTEGER NOT NULL, expires_at REAL NOT NULL,
                                          detail TEXT NOT NULL DEFAULT '');
"""
# 7269396 (d057f38 and 0209108 merged): cohorts and the expiry indexes, keys in the clear.
ROUND2_DDL = """
CREATE TABLE IF NOT EXISTS rollout_cohort_state (cohort TEXT PRIMARY KEY, data TEXT NOT NULL,
                                                 version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rollout_cohort_history (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                                                   cohort TEXT NOT NULL, version INTEGER NOT NULL,
                                                   at REAL NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS rollout_links_expiry ON rollout_links (expires_at);
CREATE INDEX IF NOT EXISTS rollout_pins_expiry ON rollout_pins (expires_at);
"""
# ed0da6b: the secret of the keyed hashes (keys hashed since), still no migrations table.
ROUND3_DDL = """
CREATE TABLE IF NOT EXISTS rollout_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
SHAPES = {
    "round0": ROUND0_DDL,
    "round1": ROUND0_DDL + LINKS_DDL,
    "round2": ROUND0_DDL + LINKS_DDL + ROUND2_DDL,
    "round3": ROUND0_DDL + LINKS_DDL + ROUND2_DDL + ROUND3_DDL,
}

SESSION = "gpt-4o-mini:alice@example.com"
OTHER = "gpt-4o-mini:bob@example.com"
DECLARED = "alice@example.com"
DERIVED = "h:" + "0123456789abcdef01234567"
OLD_SECRET = "ab" * 32


def event(version: int, percent: float, cohort: str = "") -> RolloutEvent:
    return RolloutEvent(
        at=1_000.0 + version, actor="ops", action="promote", from_mode=Mode.SPLIT,
        to_mode=Mode.SPLIT, from_percent=0.0, to_percent=percent, version=version, cohort=cohort,
    )  # fmt: skip


def to_percent(percent: float) -> Change:
    def change(current: RolloutState) -> tuple[RolloutState, RolloutEvent]:
        state = replace(current, percent=percent, version=current.version + 1)
        return state, event(state.version, percent)

    return change


def build(path: Path, shape: str) -> float:
    """A store as the release of `shape` left it: DDL, a state, its history, pins, links
    (and a cohort's state, and the secret, where the release had them). Returns the pins'
    and links' expiry."""
    expires = time.time() + 3600
    keyed = StoreKeys(OLD_SECRET) if shape == "round3" else None
    key = keyed.key if keyed else (lambda k: k)
    db = sqlite3.connect(path)
    db.executescript(SHAPES[shape])
    state = RolloutState(mode=Mode.SPLIT, percent=25.0, version=2)
    db.execute("INSERT INTO rollout_state VALUES (1, ?, 2)", (json.dumps(state.to_dict()),))
    for version, percent in ((1, 10.0), (2, 25.0)):
        data = json.dumps(event(version, percent).to_dict())
        db.execute("INSERT INTO rollout_history VALUES (?, ?, ?)", (version, 1_000 + version, data))
    db.executemany(
        "INSERT INTO rollout_pins VALUES (?, ?, ?, ?)",
        [(key(SESSION), "vllm", 0, expires), (key(OTHER), "hosted", 1, expires)],
    )
    if shape != "round0":
        conversation = keyed.conversation if keyed else (lambda c: c)
        db.executemany(
            "INSERT INTO rollout_links VALUES (?, ?, ?, ?, ?)",
            [
                (key("r:resp_1"), conversation(DECLARED), 2, expires, '["vllm", "cand_1"]'),
                (key("c:" + "ab" * 16), DERIVED, 3, expires, ""),
            ],
        )
    if shape in ("round2", "round3"):
        cohort = RolloutState(mode=Mode.SPLIT, percent=50.0, version=3)
        db.execute(
            "INSERT INTO rollout_cohort_state VALUES ('billing-bot', ?, 3)",
            (json.dumps(cohort.to_dict()),),
        )
        data = json.dumps(event(3, 50.0, "billing-bot").to_dict())
        db.execute(
            "INSERT INTO rollout_cohort_history (cohort, version, at, data) VALUES (?, 3, ?, ?)",
            ("billing-bot", 1_003.0, data),
        )
    if shape == "round3":
        db.execute("INSERT INTO rollout_meta VALUES ('key_secret', ?)", (OLD_SECRET,))
    db.commit()
    db.close()
    return expires


def stored_rows(path: Path, table: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return list(db.execute(f"SELECT * FROM {table}").fetchall())


@pytest.mark.parametrize("shape", SHAPES)
def test_a_store_written_by_an_earlier_release_upgrades_in_place(
    tmp_path: Path, shape: str
) -> None:
    path = tmp_path / "state.db"
    expires = build(path, shape)
    store = SqliteRolloutStore(f"sqlite:///{path}", SEED)
    try:
        assert store.migrated == NAMES  # each recorded; those the release had were no-ops
        assert [r[0] for r in stored_rows(path, "rollout_migrations")] == NAMES
        keys = store.keys
        if shape == "round3":  # its secret is kept: its hashed keys still resolve
            assert keys.key(SESSION) == StoreKeys(OLD_SECRET).key(SESSION)
        # The state and its history, untouched.
        assert (store.read().percent, store.read().version) == (25.0, 2)
        assert [(e.version, e.to_percent) for e in store.history(cohort="")] == [
            (1, 10.0),
            (2, 25.0),
        ]
        cohorts = shape in ("round2", "round3")
        assert store.read("billing-bot").percent == (50.0 if cohorts else 25.0)
        # A cohort's history holds the default's changes too.
        assert len(store.history(cohort="billing-bot")) == (3 if cohorts else 2)
        # Every pin survives, under its hashed key.
        pins = sorted(store.load_pins(), key=lambda p: p.backend)
        assert pins == [
            Pin(keys.key(OTHER), "hosted", 1, expires),
            Pin(keys.key(SESSION), "vllm", 0, expires),
        ]
        # Every link survives, under its hashed key; a declared conversation hashed, a
        # derived one kept.
        if shape != "round0":
            links = store.load_links([keys.key("r:resp_1"), keys.key("c:" + "ab" * 16)])
            assert sorted(links, key=lambda link: link.turn) == [
                Link(keys.key("r:resp_1"), keys.key(DECLARED), 2, expires, '["vllm", "cand_1"]'),
                Link(keys.key("c:" + "ab" * 16), DERIVED, 3, expires, ""),
            ]
        # Nothing personal is left in the file's pins and links.
        text = repr(stored_rows(path, "rollout_pins") + stored_rows(path, "rollout_links"))
        assert "alice" not in text
        assert "bob" not in text
        assert all(is_hashed(str(row[0])) for row in stored_rows(path, "rollout_pins"))
        # It goes on working: a change from the stored state.
        state, _ = store.apply(to_percent(30.0))
        assert state.version == 3
    finally:
        store.close()
    reopened = SqliteRolloutStore(f"sqlite:///{path}", SEED)
    assert reopened.migrated == []  # every migration is named: nothing runs twice
    assert reopened.keys.key(SESSION) == keys.key(SESSION)
    reopened.close()


def test_a_new_store_records_every_migration_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    first = SqliteRolloutStore(url, SEED)
    assert first.migrated == NAMES
    assert first.migrate() == []
    second = SqliteRolloutStore(url, SEED)
    assert second.migrated == []
    assert second.keys.key(SESSION) == first.keys.key(SESSION)
    first.close()
    second.close()


@pytest.mark.parametrize("rollout_first", [True, False], ids=["rollout-first", "records-first"])
def test_records_and_rollout_share_one_file_each_with_its_own_migrations(
    tmp_path: Path, rollout_first: bool
) -> None:
    """A config may name one SQLite file for both: neither store takes the other's
    migrations table for its own."""
    url = f"sqlite:///{tmp_path}/kvmigrate.db"
    if rollout_first:
        SqliteRolloutStore(url, SEED).close()
    records = open_records(url)
    rollout = SqliteRolloutStore(url, SEED)
    try:
        assert records.applied_migrations() == sorted(m.name for m in RECORD_MIGRATIONS)
        assert rollout.migrated == ([] if rollout_first else NAMES)
        path = tmp_path / "kvmigrate.db"
        assert [r[0] for r in stored_rows(path, "rollout_migrations")] == NAMES
        assert not {r[0] for r in stored_rows(path, "migrations")} & set(NAMES)
        assert records.migrate() == []
        rollout.apply(to_percent(5.0))
        assert rollout.read().percent == 5.0
    finally:
        records.close()
        rollout.close()


OPENER = textwrap.dedent(
    """
    import json, pathlib, sys, time
    from kvmigrate.rollout.sqlite_store import SqliteRolloutStore
    from kvmigrate.rollout.state import RolloutState

    url, barrier, me = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
    (barrier / me).touch()  # imported: ready
    while len(list(barrier.iterdir())) < 2:  # both open at once, once both are ready
        time.sleep(0.001)
    store = SqliteRolloutStore(url, RolloutState())
    print(json.dumps({"applied": store.migrated, "key": store.keys.key("alice")}))
    store.close()
    """
)


def test_two_processes_opening_a_new_store_at_once_apply_each_migration_once(
    tmp_path: Path,
) -> None:
    """The test holds the new file's write lock until both processes are opening it, so
    both find no migration applied and then race for the lock the moment it is let go."""
    path = tmp_path / "state.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("BEGIN IMMEDIATE")
    barrier = tmp_path / "ready"
    barrier.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, f"sqlite:///{path}", str(barrier), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in "ab"
    ]
    deadline = time.monotonic() + 60
    while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # both are past their first read and waiting on the lock
    holder.execute("COMMIT")
    holder.close()
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    applied = sorted((r["applied"] for r in results), key=len)
    assert applied == [[], NAMES]  # one applied them all, the other found them applied
    assert results[0]["key"] == results[1]["key"]  # one secret: made once
    assert [r[0] for r in stored_rows(path, "rollout_migrations")] == NAMES
