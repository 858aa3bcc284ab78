"""The shared rollout store for several proxy replicas: Redis, changed with WATCH/MULTI.

A change is an optimistic transaction on the state key: if another writer changed it
between our read and our EXEC, Redis refuses the EXEC and we recompute from the new state.
State, version and the history entry are written in one MULTI, so no reader ever sees one
without the others.

Cohorts only add keys: the round-1 `state`, `version` and `history` stay the
fleet-wide default that a cohort without its own follows; each cohort's own state is a field
of the `cohorts` hash, its changes go to the `events` list, and `generation` counts them, so
`version` + `generation` grows with every change, which is what proxies poll.

Pins and links are keyed by keyed hashes (kvmigrate.rollout.keys) under the `secret` key's
secret. Changes to what is stored are named migrations, as the SQL stores' are
(kvmigrate.sql_migrations): each name goes into the `migrations` set once it has run, and a
store opened by a later release runs the ones it lacks under the `migrating` lock, so two
replicas starting at once do not both run one. The first, `r001_hashed_keys`, makes the
secret and hashes the pins and links an older version wrote in the clear, keeping their TTLs.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import redis

from kvmigrate.config import safe_text, safe_url
from kvmigrate.rollout.keys import StoreKeys, is_hashed, new_secret
from kvmigrate.rollout.state import CohortStates, Link, Pin, RolloutEvent, RolloutState
from kvmigrate.rollout.store import Change, StoreError, decode_event, decode_state

PREFIX = "kvmigrate:rollout"
MAX_RETRIES = 50
# The migration lock's lease: a process killed while it holds the lock lets the next one in
# after this long. Each migration can be run again from the start (it skips what is done),
# so one that outlasts the lease is at worst repeated, never half-applied.
MIGRATION_LEASE_S = 60
MIGRATION_WAIT_S = 30.0
MIGRATION_POLL_S = 0.05
# Deletes the lock only if it is still ours (its lease may have passed to another process).
RELEASE_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class RedisRolloutStore:
    def __init__(self, url: str, initial: RolloutState, prefix: str = PREFIX) -> None:
        self.url = url
        self._initial = initial
        self._prefix = prefix
        try:
            self._redis: redis.Redis = redis.Redis.from_url(
                url, socket_timeout=2.0, socket_connect_timeout=2.0, decode_responses=True
            )
        except ValueError as exc:
            # The parser's reason quotes what it misread, and in a URL with a password
            # that is the password or a piece of it (a `#` or `/` in it, not
            # percent-encoded, ends the host part early): name neither then.
            if "@" in url:
                raise StoreError(
                    "bad Redis URL in rollout.state: it does not parse (percent-encode "
                    "any of / # ? @ : % in its password)"
                ) from None
            raise StoreError(f"bad Redis URL {safe_url(url)!r}: {safe_text(str(exc))}") from None
        self._where = f"Redis rollout store {safe_url(url)}"
        self._keys: StoreKeys | None = None
        self.migrated: list[str] = []  # the migrations this store ran as it opened
        # Read (and keys in the clear hashed) at open; a store opened while Redis is down
        # still opens, reads them at first use, and its first call raises StoreError.
        with contextlib.suppress(StoreError):
            self._keys = self._open_keys()

    @property
    def keys(self) -> StoreKeys:
        if self._keys is None:
            self._keys = self._open_keys()
        return self._keys

    def _open_keys(self) -> StoreKeys:
        self.migrated = self.migrate()
        return StoreKeys(str(self._call(self._redis.get, self._key("secret"))))

    def _migrations(self) -> tuple[tuple[str, Callable[[], None]], ...]:
        """Append only: never rename, edit or reorder one that has shipped."""
        return (("r001_hashed_keys", self._hash_clear_keys),)

    def migrate(self) -> list[str]:
        """Run the migrations the `migrations` set lacks, in order, under the lock; returns
        their names."""
        done_key = self._key("migrations")
        names = [name for name, _ in self._migrations()]
        if set(self._call(self._redis.smembers, done_key)) >= set(names):
            return []
        lock, token = self._key("migrating"), uuid.uuid4().hex
        deadline = time.monotonic() + MIGRATION_WAIT_S
        while not self._call(lambda: self._redis.set(lock, token, nx=True, ex=MIGRATION_LEASE_S)):
            if time.monotonic() > deadline:
                raise StoreError(f"{self._where}: another process holds {lock} (migrating)")
            time.sleep(MIGRATION_POLL_S)
        applied: list[str] = []
        try:
            done = set(self._call(self._redis.smembers, done_key))  # read under the lock
            for name, run in self._migrations():
                if name not in done:
                    run()
                    self._call(self._redis.sadd, done_key, name)
                    applied.append(name)
        finally:
            self._call(self._redis.eval, RELEASE_SCRIPT, 1, lock, token)
        return applied

    def _hash_clear_keys(self) -> None:
        """Make the secret unless there is one, then move each pin and link in the clear to
        its hashed key, with the TTL it had. A store whose release hashed keys already has
        its secret and no clear keys: nothing moves."""
        self._call(lambda: self._redis.set(self._key("secret"), new_secret(), nx=True))
        keys = StoreKeys(str(self._call(self._redis.get, self._key("secret"))))
        for kind in ("pin", "link"):
            start = self._key(f"{kind}:")
            for name in list(self._call(self._redis.scan_iter, start + "*", 1000)):
                clear = name.removeprefix(start)
                if is_hashed(clear):
                    continue
                value, ttl = self._call(self._value_and_ttl, name)
                if value is None:
                    continue  # expired meanwhile
                if kind == "link":
                    conversation, *rest = json.loads(value)
                    value = json.dumps([keys.conversation(conversation), *rest])
                with self._redis.pipeline(transaction=True) as pipe:
                    pipe.set(start + keys.key(clear), value, ex=ttl if ttl > 0 else None, nx=True)
                    pipe.delete(name)
                    self._call(pipe.execute)

    def _value_and_ttl(self, name: str) -> tuple[str | None, int]:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(name)
            pipe.ttl(name)
            value, ttl = pipe.execute()
        return value, int(ttl)

    def _key(self, name: str) -> str:
        return f"{self._prefix}:{name}"

    def read(self, cohort: str = "") -> RolloutState:
        own = self._call(self._redis.hget, self._key("cohorts"), cohort) if cohort else None
        raw = own or self._call(self._redis.get, self._key("state"))
        return decode_state(raw, self._where) if raw else self._initial

    def read_all(self) -> CohortStates:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._key("state"))
            pipe.hgetall(self._key("cohorts"))
            raw, own = self._call(pipe.execute)
        default = decode_state(raw, self._where) if raw else self._initial
        return CohortStates(default, {c: decode_state(d, self._where) for c, d in own.items()})

    def version(self) -> int:
        version, generation = self._call(
            self._redis.mget, [self._key("version"), self._key("generation")]
        )
        if version is None and generation is None:
            return self._initial.version
        return int(version or 0) + int(generation or 0)

    def apply(self, change: Change, cohort: str = "") -> tuple[RolloutState, RolloutEvent]:
        state_key, cohorts_key = self._key("state"), self._key("cohorts")
        for _ in range(MAX_RETRIES):
            try:
                with self._redis.pipeline() as pipe:
                    pipe.watch(state_key, cohorts_key)  # type: ignore[no-untyped-call]
                    own = pipe.hget(cohorts_key, cohort) if cohort else None
                    raw = own or pipe.get(state_key)
                    current = decode_state(raw, self._where) if raw else self._initial
                    state, event = change(current)
                    event = replace(event, cohort=cohort)
                    pipe.multi()
                    if cohort:
                        pipe.hset(cohorts_key, cohort, json.dumps(state.to_dict()))
                        pipe.incr(self._key("generation"))
                        pipe.rpush(self._key("events"), json.dumps(event.to_dict()))
                    else:
                        pipe.set(state_key, json.dumps(state.to_dict()))
                        pipe.set(self._key("version"), state.version)
                        pipe.rpush(self._key("history"), json.dumps(event.to_dict()))
                    pipe.execute()
                    return state, event
            except redis.WatchError:
                continue
            except redis.RedisError as exc:
                raise StoreError(f"Redis rollout store {safe_url(self.url)}: {exc}") from None
        raise StoreError("too many concurrent rollout changes; try again")

    def history(self, limit: int = 100, cohort: str | None = None) -> list[RolloutEvent]:
        """The default's changes and the cohorts', merged in time order."""
        default = self._call(self._redis.lrange, self._key("history"), -limit, -1)
        # A cohort's own events are filtered here, so all of them are read (a rollout's
        # history is hundreds of changes, not millions).
        start = -limit if cohort is None else 0
        cohorts = self._call(self._redis.lrange, self._key("events"), start, -1)
        events = [decode_event(r, self._where) for r in default]
        for raw in cohorts:
            event = decode_event(raw, self._where)
            if cohort is None or event.cohort == cohort:
                events.append(event)
        events.sort(key=lambda e: e.at)  # stable: each list is already in order
        return events[-limit:]

    def save_pins(self, pins: Sequence[Pin]) -> None:
        if not pins:
            return
        now = time.time()
        with self._redis.pipeline(transaction=False) as pipe:
            for pin in pins:
                ttl = max(1, int(pin.expires_at - now))
                pipe.set(
                    self._key(f"pin:{pin.conversation}"),
                    f"{pin.backend}|{pin.epoch}|{pin.expires_at}",
                    ex=ttl,
                    nx=True,
                )
            self._call(pipe.execute)

    def load_pins(self, conversations: Sequence[str] | None = None) -> list[Pin]:
        if conversations is None:
            keys = list(self._call(self._redis.scan_iter, self._key("pin:*"), 1000))
            conversations = [k.removeprefix(self._key("pin:")) for k in keys]
        if not conversations:
            return []
        values = self._call(self._redis.mget, [self._key(f"pin:{c}") for c in conversations])
        pins = []
        for conversation, value in zip(conversations, values, strict=True):
            if value:
                backend, epoch, expires = str(value).split("|")
                pins.append(Pin(conversation, backend, int(epoch), float(expires)))
        return pins

    def save_links(self, links: Sequence[Link]) -> None:
        if not links:
            return
        now = time.time()
        with self._redis.pipeline(transaction=False) as pipe:
            for link in links:
                if link.expires_at <= now:
                    continue
                value = json.dumps([link.conversation, link.turn, link.expires_at, link.detail])
                ttl = max(1, int(link.expires_at - now))
                pipe.set(self._key(f"link:{link.key}"), value, ex=ttl)
            self._call(pipe.execute)

    def load_links(self, keys: Sequence[str]) -> list[Link]:
        if not keys:
            return []
        values = self._call(self._redis.mget, [self._key(f"link:{k}") for k in keys])
        links = []
        now = time.time()
        for key, value in zip(keys, values, strict=True):
            if value:
                conversation, turn, expires_at, detail = json.loads(value)
                if expires_at >= now:
                    links.append(Link(key, str(conversation), int(turn), float(expires_at), detail))
        return links

    def close(self) -> None:
        self._redis.close()

    def _call(self, func: Any, *args: Any) -> Any:
        try:
            return func(*args)
        except redis.RedisError as exc:
            raise StoreError(f"Redis rollout store {safe_url(self.url)}: {exc}") from None
