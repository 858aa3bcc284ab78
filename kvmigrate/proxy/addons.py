"""Addons: plain objects hooked to named proxy events, as in mitmproxy.

An addon implements any of these methods; the others are simply not called:

    register_metrics(registry)   once, with the proxy's Prometheus CollectorRegistry
    async running()              once the proxy's event loop runs (start background tasks)
    exchange_done(exchange)      once per upstream call, after the client has its bytes
                                 (serve) or after a shadow copy ends; must not block
    async done()                 at shutdown (flush, close)

Every call is guarded, so one failing addon (a full disk under the recorder, a bug in a
scorer) can never break a client's response or another addon.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("kvmigrate.proxy")

EVENTS = ("register_metrics", "running", "exchange_done", "done")


class Addons:
    def __init__(self, addons: Sequence[object] = ()) -> None:
        self._addons = list(addons)
        self._hooks: dict[str, list[Any]] = {
            event: [getattr(a, event) for a in self._addons if callable(getattr(a, event, None))]
            for event in EVENTS
        }

    def trigger(self, event: str, *args: Any) -> None:
        """Call a synchronous hook on every addon that has it."""
        for hook in self._hooks[event]:
            try:
                hook(*args)
            except Exception:
                log.exception("addon hook %s failed", _name(hook))

    async def trigger_async(self, event: str) -> None:
        """Await an asynchronous hook (`running`, `done`) on every addon, one after another."""
        for hook in self._hooks[event]:
            try:
                result = hook()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("addon hook %s failed", _name(hook))

    def exchange_done(self, exchange: object) -> None:
        self.trigger("exchange_done", exchange)


def _name(hook: Any) -> str:
    owner = getattr(hook, "__self__", None)
    return f"{type(owner).__name__}.{hook.__name__}" if owner is not None else repr(hook)
