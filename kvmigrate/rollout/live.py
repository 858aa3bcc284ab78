"""The rollout as a running proxy sees it: a snapshot swapped in when the store changes.

The response path only ever reads an in-memory snapshot. A background task polls the
store's version a few times a second and swaps the whole snapshot when it moves, so a
change applies within a second, in-flight requests finish on the snapshot they started
with, and a store outage leaves the proxy serving on the last state it knew.
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
from kvmigrate.rollout.state import Pin, RolloutState
from kvmigrate.rollout.store import RolloutStore, StoreError
from kvmigrate.supervisor import Supervisor

log = logging.getLogger("kvmigrate.rollout")

MAX_LOCAL_PINS = 200_000
REMOTE_PIN_TIMEOUT = 0.05


class LiveRollout:
    def __init__(
        self,
        config: Config,
        store: RolloutStore,
        poll_interval: float = 0.25,
        shared_pins: bool | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.config = config
        self.supervisor = supervisor or Supervisor()
        self.store = store
        self.poll_interval = poll_interval
        # With a shared store (Redis) another replica may have pinned the conversation.
        self.shared_pins = store.url.startswith("redis") if shared_pins is None else shared_pins
        self.state = _from_config(config)
        self._snapshot = self._make_snapshot(self.state)
        self._pins: OrderedDict[str, PinView] = OrderedDict()
        self._unsaved: list[Pin] = []
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[RolloutState], None]] = []
        self.store_errors = 0
        self._gauges: tuple[Gauge, Gauge, Gauge] | None = None

    def current(self) -> RolloutSnapshot:
        return self._snapshot

    def on_change(self, listener: Callable[[RolloutState], None]) -> None:
        self._listeners.append(listener)

    async def route(self, conversation: str, turn: int, served: Collection[str]) -> Route:
        """Route one request: the conversation's pin applied, and made on its first sight in
        split mode. Only a later turn can have a pin another replica made, so only a later
        turn asks a shared store for one."""
        snapshot = self._snapshot
        if not self.config.rollout.pinning or snapshot.mode != Mode.SPLIT:
            return route(conversation, snapshot, served)
        now = time.time()
        pin = self._pins.get(conversation)
        if pin is None and turn > 1 and self.shared_pins:
            pin = await self._remote_pin(conversation)
        if pin is not None:
            self._pins.move_to_end(conversation)
        routed = route(conversation, snapshot, served, pin, now)
        if routed.pin:
            expires = now + self.config.rollout.pin_ttl_seconds
            self._remember(Pin(conversation, routed.serve, snapshot.epoch, expires))
        return routed

    def _remember(self, pin: Pin) -> None:
        self._pins[pin.conversation] = PinView(pin.backend, pin.epoch, pin.expires_at)
        if len(self._pins) > MAX_LOCAL_PINS:
            self._pins.popitem(last=False)
        self._unsaved.append(pin)

    async def _remote_pin(self, conversation: str) -> PinView | None:
        try:
            pins = await asyncio.wait_for(
                asyncio.to_thread(self.store.load_pins, [conversation]), REMOTE_PIN_TIMEOUT
            )
        except (TimeoutError, StoreError):
            return None
        if not pins:
            return None
        view = PinView(pins[0].backend, pins[0].epoch, pins[0].expires_at)
        self._pins[conversation] = view
        return view

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self._gauges = (
            Gauge(
                "kvmigrate_rollout_percent",
                "The candidate's share of conversations (0 in shadow mode).",
                registry=registry,
                multiprocess_mode="livemostrecent",
            ),
            Gauge(
                "kvmigrate_rollout_split",
                "1 in split mode, 0 in shadow mode.",
                registry=registry,
                multiprocess_mode="livemostrecent",
            ),
            Gauge(
                "kvmigrate_rollout_version",
                "Version of the rollout state this proxy applies.",
                registry=registry,
                multiprocess_mode="livemin",
            ),
        )
        self._update_gauges()

    def _update_gauges(self) -> None:
        if self._gauges is not None:
            split = self.state.mode == Mode.SPLIT
            self._gauges[0].set(self.state.percent if split else 0)
            self._gauges[1].set(1 if split else 0)
            self._gauges[2].set(self.state.version)

    async def running(self) -> None:
        """Read the state (and the saved pins) before serving, then watch for changes."""
        try:
            state = await asyncio.to_thread(self.store.read)
            self._swap(state)
            if not self.shared_pins:
                for pin in await asyncio.to_thread(self.store.load_pins):
                    self._pins[pin.conversation] = PinView(pin.backend, pin.epoch, pin.expires_at)
        except StoreError as exc:
            self.store_errors += 1
            log.error("rollout store unavailable at start, serving the config's rollout: %s", exc)
            self._swap(_from_config(self.config))
        self._task = self.supervisor.start("rollout-watch", self._watch)

    async def done(self) -> None:
        await self.supervisor.stop(self._task)
        with contextlib.suppress(StoreError):
            await self._flush_pins()

    async def _watch(self) -> None:
        last_error = 0.0
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                version = await asyncio.to_thread(self.store.version)
                if version != self.state.version:
                    self._swap(await asyncio.to_thread(self.store.read))
                await self._flush_pins()
            except StoreError as exc:
                self.store_errors += 1
                if time.monotonic() - last_error > 30:  # one line per outage, not per poll
                    last_error = time.monotonic()
                    log.error("rollout store unavailable, keeping the last state: %s", exc)

    async def _flush_pins(self) -> None:
        if not self._unsaved:
            return
        batch, self._unsaved = self._unsaved, []
        try:
            await asyncio.to_thread(self.store.save_pins, batch)
        except StoreError:
            self._unsaved = batch[-10_000:] + self._unsaved  # retry later, bounded
            raise

    def _swap(self, state: RolloutState) -> None:
        changed = state.version != self.state.version or state.epoch != self.state.epoch
        self.state = state
        self._snapshot = self._make_snapshot(state)
        self._update_gauges()
        if changed:
            log.info(
                "rollout now mode=%s percent=%g (version %d)",
                state.mode,
                state.percent,
                state.version,
            )
            for listener in self._listeners:
                listener(state)

    def _make_snapshot(self, state: RolloutState) -> RolloutSnapshot:
        return state.snapshot(self.config.rollout)


def _from_config(config: Config) -> RolloutState:
    return RolloutState.from_config(config.rollout)
