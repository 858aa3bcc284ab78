"""The SQLite rollout store's contract in tables: the version every proxy polls, changes
applied to the stored state (not the seed), pins and their expiry, and the URL and error
messages. Each row pins what a mutant of rollout/sqlite_store.py changed (docs/mutation.md)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from kvmigrate.rollout.sqlite_store import SqliteRolloutStore, sqlite_path
from kvmigrate.rollout.state import Pin, RolloutEvent, RolloutState
from kvmigrate.rollout.store import Change, StoreError

SEED = RolloutState(version=7)  # a config's seed: not version 0, so a default cannot pass


def step(percent: float) -> Change:
    def change(current: RolloutState) -> tuple[RolloutState, RolloutEvent]:
        state = replace(current, percent=percent, version=current.version + 1)
        event = RolloutEvent.from_dict(
            {"at": time.time(), "actor": "t", "action": "set", "from_mode": current.mode,
             "to_mode": state.mode, "from_percent": current.percent, "to_percent": percent,
             "reason": "", "forced": True, "gates": [], "version": state.version}
        )  # fmt: skip
        return state, event

    return change


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/nested/dir/state.db"


def test_the_version_proxies_poll(url: str) -> None:
    store = SqliteRolloutStore(url, SEED)
    assert store.version() == 7  # nothing stored yet: the seed's
    assert store.read() == SEED
    other = SqliteRolloutStore(url, RolloutState())  # another process, another seed
    state, event = other.apply(step(10))
    assert (state.version, state.percent, event.version) == (1, 10, 1)  # from its own seed
    assert store.version() == 1  # the stored version, not either seed
    assert store.read().percent == 10
    state, _ = store.apply(step(50))
    assert (state.version, state.percent) == (2, 50)  # from the stored state, not the seed
    assert other.version() == 2
    assert [e.to_percent for e in other.history()] == [10, 50]
    assert [e.to_percent for e in other.history(1)] == [50]  # the latest, oldest first
    store.close()
    other.close()


def test_pins_are_kept_once_filtered_and_expire(url: str) -> None:
    store = SqliteRolloutStore(url, SEED)
    now = time.time()
    store.save_pins([])  # nothing to write: no transaction, no error
    store.save_pins([Pin("a", "vllm", 0, now + 60), Pin("b", "hosted", 1, now + 60),
                     Pin("old", "vllm", 0, now - 1)])  # fmt: skip
    assert sorted(p.conversation for p in store.load_pins()) == ["a", "b"]
    assert store.load_pins(["b", "missing"]) == [Pin("b", "hosted", 1, now + 60)]
    assert store.load_pins([]) == []
    # The first pin of a conversation holds: a later one does not move it.
    store.save_pins([Pin("a", "hosted", 2, now + 120)])
    assert store.load_pins(["a"]) == [Pin("a", "vllm", 0, now + 60)]
    # An expired pin is deleted by the next save, so a new one can take its place.
    store.save_pins([Pin("old", "hosted", 3, now + 60)])
    assert store.load_pins(["old"]) == [Pin("old", "hosted", 3, now + 60)]
    store.close()


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///state.db", "state.db"),
        ("sqlite:///a", "a"),
        ("sqlite:////abs/s.db", "/abs/s.db"),
    ],
)
def test_sqlite_urls(url: str, path: str) -> None:
    assert sqlite_path(url) == Path(path)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite://state.db", "state.db"])
def test_bad_sqlite_urls_say_what_is_expected(url: str) -> None:
    with pytest.raises(StoreError) as caught:
        sqlite_path(url)
    assert str(caught.value) == (
        f"expected sqlite:///relative.db or sqlite:////absolute.db, got {url!r}"
    )


def test_a_store_that_cannot_be_opened_says_which(tmp_path: Path) -> None:
    (tmp_path / "state.db").mkdir()  # a directory where the file should be
    with pytest.raises(StoreError) as caught:
        SqliteRolloutStore(f"sqlite:///{tmp_path}/state.db", SEED)
    assert str(caught.value).startswith(f"cannot open rollout store {tmp_path}/state.db: ")


def test_a_broken_store_file_is_a_store_error(tmp_path: Path) -> None:
    store = SqliteRolloutStore(f"sqlite:///{tmp_path}/state.db", SEED)
    store.close()
    with pytest.raises(StoreError, match=f"rollout store {tmp_path}/state.db: "):
        store.version()
    with pytest.raises(StoreError, match=f"rollout store {tmp_path}/state.db: "):
        store.load_pins()


def test_history_defaults_to_the_latest_hundred(url: str) -> None:
    store = SqliteRolloutStore(url, RolloutState())
    for i in range(101):
        store.apply(step(i % 100))
    versions = [e.version for e in store.history()]
    assert versions == list(range(2, 102))
    store.close()


def change_at(percent: float, at: float) -> Change:
    """`step` at a given time, so the histories' order is the rows' own."""

    def change(current: RolloutState) -> tuple[RolloutState, RolloutEvent]:
        state, event = step(percent)(current)
        return state, replace(event, at=at)

    return change


def changes(events: list[RolloutEvent]) -> list[tuple[str, float, int]]:
    return [(e.cohort, e.to_percent, e.version) for e in events]


def test_a_cohort_follows_the_default_until_it_has_a_state_of_its_own(url: str) -> None:
    store = SqliteRolloutStore(url, SEED)
    assert store.read("a") == SEED  # nothing stored: the seed, for every cohort
    default, event = store.apply(change_at(10, 100.0))
    assert (default.version, event.cohort) == (8, "")
    assert store.read("a") == store.read() == default
    assert store.version() == 8
    # A cohort's first change starts from the default's state; the default does not move.
    a, event = store.apply(change_at(20, 101.0), cohort="a")
    assert (a.version, a.percent, event.cohort, event.version) == (9, 20, "a", 9)
    assert (store.read("a"), store.read(), store.read("b")) == (a, default, default)
    assert store.version() == 8 + 9  # what proxies poll: every state's version, summed
    a, _ = store.apply(change_at(30, 102.0), cohort="a")  # from its own state now
    b, _ = store.apply(change_at(40, 103.0), cohort="b")
    default, _ = store.apply(change_at(50, 104.0))
    assert (a.version, b.version, default.version) == (10, 9, 9)
    assert store.version() == 9 + 10 + 9
    every = store.read_all()
    assert (every.default, every.own) == (default, {"a": a, "b": b})
    # A cohort's history: its own changes and the default's, in time order.
    assert changes(store.history(cohort="a")) == [
        ("", 10, 8), ("a", 20, 9), ("a", 30, 10), ("", 50, 9)
    ]  # fmt: skip
    assert changes(store.history(cohort="b")) == [("", 10, 8), ("b", 40, 9), ("", 50, 9)]
    assert changes(store.history(2, cohort="a")) == [("a", 30, 10), ("", 50, 9)]
    assert changes(store.history(cohort="c")) == [("", 10, 8), ("", 50, 9)]
    assert [e.to_percent for e in store.history()] == [10, 20, 30, 40, 50]
    other = SqliteRolloutStore(url, RolloutState())  # another process sees the same
    assert (other.read("a"), other.read("b"), other.read("c")) == (a, b, default)
    other.close()
    store.close()
    with pytest.raises(StoreError, match=f"rollout store {url.removeprefix('sqlite:///')}: "):
        store.read("a")
