"""One served chat request checked against its conversation's last turn: the detector's
work, whichever thread or process it runs in (kvmigrate.cachecheck.addon)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from kvmigrate.cachecheck.compare import Tokenize, TurnCheck
from kvmigrate.cachecheck.fingerprint import FingerprintStore
from kvmigrate.cachecheck.tracker import ConversationTracker, tracking_key
from kvmigrate.wire.assemble import assemble

CHAT_ROUTE = "chat/completions"
MESSAGES_ROUTE = "messages"
CHECKED_ROUTES = frozenset({CHAT_ROUTE, MESSAGES_ROUTE})


@dataclass(frozen=True, slots=True)
class CacheCheckResult:
    """The verdict on one served request, for the recorder or anyone else to keep."""

    request_id: str
    conversation: str
    check: TurnCheck

    def as_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, **self.check.as_dict()}


class CheckItem(NamedTuple):
    """What the checker reads of a served exchange; a plain tuple, so it pickles cheaply."""

    request_id: str
    conversation: str
    turn: int
    ok: bool
    request_body: bytes
    response_body: bytes
    route: str = CHAT_ROUTE
    identity: str = ""  # how the proxy knew the conversation (continuity.resolver.SOURCES)


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_conversations: int = 50_000
    max_bytes: int = 256 << 20
    ttl_s: float = 3600.0


class CacheChecker:
    """The fingerprints of every tracked conversation, and the check of each new turn.
    Stateful and single-threaded: one checker per worker."""

    def __init__(self, limits: StoreLimits, tokenize: Tokenize | None = None) -> None:
        self.store = FingerprintStore(limits.max_conversations, limits.max_bytes, limits.ttl_s)
        self._tracker = ConversationTracker(self.store, tokenize)

    def check(self, item: CheckItem) -> CacheCheckResult | None:
        """None for a failed call (retried with the same prompt, it leaves no answer) or a
        body that is not a chat request."""
        if not item.ok:
            return None
        request = orjson.loads(item.request_body)
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            return None
        response = assemble(item.route, item.response_body)
        key = tracking_key(item.conversation, request, item.identity)
        check = self._tracker.observe(key, request, response, time.monotonic(), item.turn)
        return CacheCheckResult(item.request_id, item.conversation, check)
