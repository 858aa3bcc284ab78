"""Addons: plain objects hooked to named proxy events, as in mitmproxy.

Every call is guarded, so one failing addon (a full disk under the recorder, a bug in a
scorer) can never break a client's response or another addon.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from kvmigrate.proxy.exchange import Exchange

log = logging.getLogger("kvmigrate.proxy")


@runtime_checkable
class ExchangeAddon(Protocol):
    def exchange_done(self, exchange: Exchange) -> None:
        """Called once per upstream call, after the client has its bytes (serve) or the
        shadow copy has finished. Must not block: hand slow work to a background task."""


class Addons:
    def __init__(self, addons: Sequence[object] = ()) -> None:
        self._exchange = [a for a in addons if isinstance(a, ExchangeAddon)]

    def exchange_done(self, exchange: Exchange) -> None:
        for addon in self._exchange:
            try:
                addon.exchange_done(exchange)
            except Exception:
                log.exception("addon %s failed on exchange_done", type(addon).__name__)
