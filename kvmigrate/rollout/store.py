"""Where the rollout state lives: the store interface, and opening one by URL."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Final, Protocol

from kvmigrate.config.secret import safe_url
from kvmigrate.lazy import implementation
from kvmigrate.rollout.keys import StoreKeys
from kvmigrate.rollout.state import CohortStates, Link, Pin, RolloutEvent, RolloutState

# A change computes the new state and its audit event from the current state, so the
# store can apply it atomically (and retry it after losing a race).
Change = Callable[[RolloutState], tuple[RolloutState, RolloutEvent]]


log = logging.getLogger("kvmigrate.rollout")


class StoreError(Exception):
    """The store cannot be reached or used; the message says which and why."""


class UnreadableState(ValueError):
    """The store answered with a state or change this version cannot read (a newer
    version's mode, a row that is not JSON); the message names the store. A ValueError,
    not a StoreError: a running proxy's watcher meets it as an unexpected failure, logged
    with its traceback and retried with backoff (kvmigrate.supervisor), while the CLI
    says it in one line."""


def decode_state(raw: str | bytes, where: str) -> RolloutState:
    """A stored state, or UnreadableState."""
    try:
        return RolloutState.from_dict(json.loads(raw))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UnreadableState(f"{where}: cannot read a stored rollout state ({exc})") from None


def decode_event(raw: str | bytes, where: str) -> RolloutEvent:
    """A history entry, or UnreadableState."""
    try:
        return RolloutEvent.from_dict(json.loads(raw))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UnreadableState(f"{where}: cannot read a stored rollout change ({exc})") from None


class RolloutStore(Protocol):
    """State is kept per cohort (`""`: the fleet-wide default, which is all a store written
    before cohorts holds, and what a cohort without a state of its own follows)."""

    url: str

    @property
    def keys(self) -> StoreKeys:
        """The keyed hash pins and links are keyed by (kvmigrate.rollout.keys): keys and
        conversations reach the store hashed, never in the clear."""
        ...

    def read(self, cohort: str = "") -> RolloutState:
        """The cohort's state (the initial state when nothing was written yet)."""
        ...

    def read_all(self) -> CohortStates:
        """Every state at once: what a running proxy swaps in."""
        ...

    def version(self) -> int:
        """A number that grows with every change to any cohort, cheaply: what running
        proxies poll."""
        ...

    def apply(self, change: Change, cohort: str = "") -> tuple[RolloutState, RolloutEvent]:
        """Apply `change` to the cohort atomically: state and event are written together or
        not at all. A cohort's first change starts from the default it followed."""
        ...

    def history(self, limit: int = 100, cohort: str | None = None) -> list[RolloutEvent]:
        """The audit trail, oldest first: every cohort's, or one cohort's with the
        fleet-wide changes it followed."""
        ...

    def save_pins(self, pins: Sequence[Pin]) -> None:
        """Keep conversation pins (keyed by `keys.key(...)`); a pin already present for a
        conversation is kept."""
        ...

    def load_pins(self, conversations: Sequence[str] | None = None) -> list[Pin]:
        """Unexpired pins: all of them, or those of the given conversations."""
        ...

    def save_links(self, links: Sequence[Link]) -> None:
        """Keep links (same TTL as pins); a later link for the same key replaces it."""
        ...

    def load_links(self, keys: Sequence[str]) -> list[Link]:
        """The unexpired links of the given keys (those not found are simply absent)."""
        ...

    def close(self) -> None: ...


# The store for each URL scheme, imported when a URL asks for it: the stores import this
# module for `Change` and `StoreError`, so it cannot import them as it loads (and redis
# loads only for a redis URL).
STORES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "sqlite": "kvmigrate.rollout.sqlite_store:SqliteRolloutStore",
        "redis": "kvmigrate.rollout.redis_store:RedisRolloutStore",
        "rediss": "kvmigrate.rollout.redis_store:RedisRolloutStore",
    }
)


def store_keys(store: RolloutStore) -> StoreKeys | None:
    """The store's keys, or None while it cannot be read (a Redis store down at start)."""
    try:
        return store.keys
    except StoreError as exc:
        log.warning(
            "%s: the recorder hashes conversation ids with a key of this process until a "
            "restart finds the store (set record.hash_key to need no store)",
            exc,
        )
        return None


def open_store(url: str, initial: RolloutState) -> RolloutStore:
    """A store for `rollout.state`; `initial` seeds it the first time it is used."""
    store_class: Callable[[str, RolloutState], RolloutStore] | None = implementation(url, STORES)
    if store_class is None:
        where = safe_url(url)
        raise StoreError(f"unsupported rollout store URL {where!r}: use sqlite:/// or redis://")
    return store_class(url, initial)
