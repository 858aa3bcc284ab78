"""What the rollout store keeps in place of a conversation key: a keyed hash.

Pins and links are keyed by conversation keys, and a conversation key is often personal
data (an `X-Session-ID` that is an email, a `user`, Anthropic's `metadata.user_id`). The
store keeps HMAC-SHA256 of the key under a secret made with the store (its meta table, or a
Redis key), so every proxy sharing the store computes the same hash, and a copy of the store
names nobody. Keys are hashed whole, as the proxy builds them (`<cohort>:<conversation>`,
`r:<response id>`), so a store written before hashing upgrades by hashing each key it holds.

A link's value names a conversation too: a declared one is kept hashed, and the request
that continues it, which declares it again, recovers it (`recover`). A key the proxy derived
itself (`h:` and a digest of the opening) names nobody and is kept as it is, so a
conversation continued through another proxy keeps its key, its split bucket and its pin.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Iterable

from kvmigrate.policies.conversation import is_derived_key

HASHED_PREFIX = "k#"
HASH_HEX_DIGITS = 32  # 128 bits: collisions are out of reach for any number of conversations
SECRET_BYTES = 32
_HEX = frozenset("0123456789abcdef")


def new_secret() -> str:
    """A secret for a new store (hex, so every store can keep it as text)."""
    return secrets.token_hex(SECRET_BYTES)


def is_hashed(key: str) -> bool:
    return (
        key.startswith(HASHED_PREFIX)
        and len(key) == len(HASHED_PREFIX) + HASH_HEX_DIGITS
        and set(key[len(HASHED_PREFIX) :]) <= _HEX
    )


class StoreKeys:
    """The keyed hash of one store's secret. Cheap enough for every request (one HMAC of a
    short string); the secret is read once, when the store opens."""

    __slots__ = ("_secret",)

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode("ascii")

    def __repr__(self) -> str:  # never the secret
        return "StoreKeys(...)"

    def key(self, key: str) -> str:
        """The store's key for a pin or link key; a key already hashed is kept."""
        if is_hashed(key):
            return key
        data = key.encode("utf-8", "surrogateescape")
        # The one-shot C HMAC: half the time of `hmac.new`, and the store's writer hashes
        # every link it saves.
        digest = hmac.digest(self._secret, data, "sha256")
        return HASHED_PREFIX + digest[: HASH_HEX_DIGITS // 2].hex()

    def records_key(self) -> bytes:
        """The key the recorder hashes conversation ids with (`record.hash_key` unset):
        derived from the store's secret, so every proxy on the store hashes alike, across
        restarts, and a copy of the records alone cannot test a guessed id."""
        return hmac.digest(self._secret, b"kvmigrate records conversation key", "sha256")

    def conversation(self, conversation: str) -> str:
        """A link's conversation as the store keeps it: hashed unless derived."""
        return conversation if is_derived_key(conversation) else self.key(conversation)

    def recover(self, stored: str, candidates: Iterable[str | None]) -> str:
        """The conversation a stored (hashed) one stands for, when the request names it
        again (its declared key, its Conversations API id); else the hash, which stays the
        same for every later turn."""
        if not is_hashed(stored):
            return stored
        for candidate in candidates:
            if candidate and self.key(candidate) == stored:
                return candidate
        return stored


def random_keys() -> StoreKeys:
    """For a resolver without a store: nothing is kept, so any secret will do."""
    return StoreKeys(new_secret())
