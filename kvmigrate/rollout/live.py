"""The rollout as a running proxy sees it: a snapshot swapped in when the store changes.

The response path only ever reads an in-memory snapshot, one per cohort. A background
task polls the store's version a few times a second and swaps every cohort's snapshot when
it moves, so a change applies within a second, in-flight requests finish on the snapshot
they started with, and a store outage leaves the proxy serving on the last state it knew.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection

from prometheus_client import CollectorRegistry, Gauge

from kvmigrate.config import Config
from kvmigrate.policies import Mode, RolloutSnapshot
from kvmigrate.policies.pinning import PinView
from kvmigrate.policies.route import Route, route
from kvmigrate.rollout.keys import random_keys
from kvmigrate.rollout.state import CohortStates, Pin, RolloutState
from kvmigrate.rollout.store import RolloutStore, StoreError, UnreadableState
from kvmigrate.supervisor import Supervisor

log = logging.getLogger("kvmigrate.rollout")

MAX_LOCAL_PINS = 200_000
# Read only for a later turn this proxy has no pin for (another replica's conversation, or
# one from before a restart); the answer is then remembered here. A read that does not answer
# in time is routed by the split and held here only, briefly (UNANSWERED_PIN_S). Beside a
# CPU hog a Redis read can outlast a tight bound; the same bound as a link read's.
REMOTE_PIN_TIMEOUT = 0.5
# A turn routed while the store did not answer is held where it went, here only, this long:
# each such conversation waits for a hung store at most once in this span, then follows the
# store's pin again. The store keeps another replica's pin (its writes are first-pin-wins),
# so a choice held for the pin's whole TTL (an hour) sent the conversation, from this
# replica only, to the other backend for that hour.
UNANSWERED_PIN_S = 30.0


class LiveRollout:
    def __init__(
        self,
        config: Config,
        store: RolloutStore,
        poll_interval: float = 0.25,
        shared_pins: bool | None = None,
        supervisor: Supervisor | None = None,
        unanswered_pin_s: float = UNANSWERED_PIN_S,
    ) -> None:
        self.config = config
        self.unanswered_pin_s = unanswered_pin_s
        self.supervisor = supervisor or Supervisor()
        self.store = store
        self.poll_interval = poll_interval
        # With a shared store (Redis) another replica may have pinned the conversation.
        self.shared_pins = store.url.startswith("redis") if shared_pins is None else shared_pins
        self.cohorts = config.cohort_names()
        # The generation polled from the store, and each cohort's state and snapshot;
        # `state`/`_snapshot`: the fleet-wide default's, for a cohort the config lacks.
        self.generation = 0
        self.state = _from_config(config)
        self.states: dict[str, RolloutState] = dict.fromkeys(self.cohorts, self.state)
        self._snapshot = self._make_snapshot(self.state)
        self._snapshots = {c: self._make_snapshot(self.state, c) for c in self.cohorts}
        self._pins: OrderedDict[str, PinView] = OrderedDict()
        self._unsaved: list[Pin] = []
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[str, RolloutState], None]] = []
        self.store_errors = 0
        self._last_error_log = float("-inf")  # when a store outage was last logged
        self._gauges: tuple[Gauge, Gauge, Gauge] | None = None
        # The store's keys, read at start; until then (a store down at start) pins are
        # kept under a secret of this process's own, which no other proxy shares.
        self.keys = random_keys()
        self._keys_read = False

    def current(self, cohort: str = "") -> RolloutSnapshot:
        return self._snapshots.get(cohort, self._snapshot)

    def state_of(self, cohort: str) -> RolloutState:
        return self.states.get(cohort, self.state)

    def on_change(self, listener: Callable[[str, RolloutState], None]) -> None:
        """`listener(cohort, state)` for every cohort whose state changed."""
        self._listeners.append(listener)

    async def route(
        self, conversation: str, turn: int, served: Collection[str], cohort: str = ""
    ) -> Route:
        """Route one request by its cohort's snapshot: the conversation's pin applied, and
        made on its first sight in split mode. Only a later turn can have a pin another
        replica made, so only a later turn asks a shared store for one."""
        snapshot = self._snapshots.get(cohort, self._snapshot)
        if not self.config.rollout.pinning or snapshot.mode != Mode.SPLIT:
            return route(conversation, snapshot, served)
        now = time.time()
        # A pin is the cohort's: one session may use two models that move apart. A pin
        # made before cohorts (keyed by the conversation alone) still holds.
        # Pins are keyed by the store's keyed hash: a session id is often an email.
        pin_key = self.keys.key
        key = pin_key(f"{cohort}:{conversation}" if cohort else conversation)
        found = key if key in self._pins or not cohort else pin_key(conversation)
        pin = self._pins.get(found)
        if pin is not None and pin.expires_at < now:
            pin = None  # as if none: the store may hold a newer one
        answered = True
        if pin is None and turn > 1 and self.shared_pins:
            found = key
            answered, pin = await self._remote_pin(key, pin_key(conversation))
        if pin is not None:
            self._pins.move_to_end(found)
        routed = route(conversation, snapshot, served, pin, now)
        if routed.pin and answered:
            expires = now + self.config.rollout.pin_ttl_seconds
            self._remember(Pin(key, routed.serve, snapshot.epoch, expires))
        elif routed.pin:
            # The store did not answer, and may hold another replica's pin for this
            # conversation: hold this choice here only, briefly, then ask the store again.
            self._hold(key, PinView(routed.serve, snapshot.epoch, now + self.unanswered_pin_s))
        return routed

    def _remember(self, pin: Pin) -> None:
        self._hold(pin.conversation, PinView(pin.backend, pin.epoch, pin.expires_at))
        self._unsaved.append(pin)

    def _hold(self, key: str, view: PinView) -> None:
        self._pins[key] = view
        self._pins.move_to_end(key)
        if len(self._pins) > MAX_LOCAL_PINS:
            self._pins.popitem(last=False)

    async def _remote_pin(self, key: str, conversation: str) -> tuple[bool, PinView | None]:
        """Whether the store answered, and the cohort's pin another replica made (or one
        made before cohorts)."""
        keys = [key] if key == conversation else [key, conversation]
        try:
            pins = await asyncio.wait_for(
                asyncio.to_thread(self.store.load_pins, keys), REMOTE_PIN_TIMEOUT
            )
        except (TimeoutError, StoreError):
            return False, None
        if not pins:
            return True, None
        pin = min(pins, key=lambda p: keys.index(p.conversation))
        view = PinView(pin.backend, pin.epoch, pin.expires_at)
        self._hold(key, view)
        return True, view

    def register_metrics(self, registry: CollectorRegistry) -> None:
        # One series per configured cohort: the label's values come from the config only.
        self._gauges = (
            Gauge(
                "kvmigrate_rollout_percent",
                "The candidate's share of the cohort's conversations (0 in shadow mode).",
                ["cohort"],
                registry=registry,
                multiprocess_mode="livemostrecent",
            ),
            Gauge(
                "kvmigrate_rollout_split",
                "1 in split mode, 0 in shadow mode.",
                ["cohort"],
                registry=registry,
                multiprocess_mode="livemostrecent",
            ),
            Gauge(
                "kvmigrate_rollout_version",
                "Version of the cohort's rollout state this proxy applies.",
                ["cohort"],
                registry=registry,
                multiprocess_mode="livemin",
            ),
        )
        self._update_gauges()

    def _update_gauges(self) -> None:
        if self._gauges is None:
            return
        percent, split, version = self._gauges
        for cohort, state in (self.states or {"": self.state}).items():
            on = state.mode == Mode.SPLIT
            # The snapshot's share: a removed candidate's stored one serves no one.
            percent.labels(cohort).set(self.current(cohort).percent if on else 0)
            split.labels(cohort).set(1 if on else 0)
            version.labels(cohort).set(state.version)

    async def running(self) -> None:
        """Read the state (and the saved pins) before serving, then watch for changes."""
        try:
            await self._read_keys()
            generation = await asyncio.to_thread(self.store.version)
            self._swap(await asyncio.to_thread(self.store.read_all), generation)
            if not self.shared_pins:
                for pin in await asyncio.to_thread(self.store.load_pins):
                    self._pins[pin.conversation] = PinView(pin.backend, pin.epoch, pin.expires_at)
        except (StoreError, UnreadableState) as exc:
            # An unreadable state too: raised from here, it stopped the watcher from ever
            # starting, so the proxy never followed the store again once it was fixed.
            self.store_errors += 1
            self._last_error_log = time.monotonic()  # this outage is said: not again at once
            log.error("rollout store unavailable at start, serving the config's rollout: %s", exc)
            self._swap(CohortStates(_from_config(self.config)), 0)
        self._task = self.supervisor.start("rollout-watch", self._watch)

    async def done(self) -> None:
        await self.supervisor.stop(self._task)
        with contextlib.suppress(StoreError):
            await self._flush_pins()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                if not self._keys_read:
                    await self._read_keys()
                # Read before the states: a change between the two is seen again next poll.
                generation = await asyncio.to_thread(self.store.version)
                if generation != self.generation:
                    self._swap(await asyncio.to_thread(self.store.read_all), generation)
                await self._flush_pins()
            except StoreError as exc:
                self.store_errors += 1
                if time.monotonic() - self._last_error_log > 30:  # a line an outage, not a poll
                    self._last_error_log = time.monotonic()
                    log.error("rollout store unavailable, keeping the last state: %s", exc)

    async def _read_keys(self) -> None:
        self.keys = await asyncio.to_thread(lambda: self.store.keys)
        self._keys_read = True

    async def _flush_pins(self) -> None:
        if not self._unsaved:
            return
        batch, self._unsaved = self._unsaved, []
        try:
            await asyncio.to_thread(self.store.save_pins, batch)
        except StoreError:
            self._unsaved = batch[-10_000:] + self._unsaved  # retry later, bounded
            raise

    def _swap(self, states: CohortStates, generation: int) -> None:
        self.generation = generation
        self.state = states.default
        self._snapshot = self._make_snapshot(states.default)
        changed = []
        for cohort in self.cohorts:
            old, new = self.states[cohort], states.of(cohort)
            if new.version != old.version or new.epoch != old.epoch or new != old:
                self.states[cohort] = new
                self._snapshots[cohort] = self._make_snapshot(new, cohort)
                changed.append(cohort)
        self._update_gauges()
        for cohort in changed:
            state = self.states[cohort]
            log.info(
                "rollout of %s now mode=%s percent=%g (version %d)",
                cohort,
                state.mode,
                state.percent,
                state.version,
            )
            for listener in self._listeners:
                listener(cohort, state)

    def _make_snapshot(self, state: RolloutState, cohort: str = "") -> RolloutSnapshot:
        return state.snapshot(self.config.rollout, self.config.candidates_of(cohort))


def _from_config(config: Config) -> RolloutState:
    return RolloutState.from_config(config.rollout)
