"""Sticky, monotone split buckets and conversation-level shadow sampling."""

from __future__ import annotations

import hashlib

BUCKETS = 10_000


def bucket(salt: str, key: str) -> int:
    """A stable bucket in [0, 10000) for a conversation key."""
    digest = hashlib.blake2b(f"{salt}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def in_candidate_share(salt: str, key: str, percent: float) -> bool:
    """`bucket < percent * 100`: a conversation inside 10% is also inside 50% (monotone)."""
    return bucket(salt, key) < round(percent * 100)


def in_shadow_sample(salt: str, key: str, share: float) -> bool:
    """Whole conversations are sampled, so the candidate sees every turn of the ones it gets.

    A separate salt keeps the shadow sample independent of the split buckets.
    """
    return bucket(salt + "\x00shadow", key) < round(share * BUCKETS)


def in_noise_sample(salt: str, key: str, share: float) -> bool:
    """The shadowed conversations that also ask the primary twice, for the noise floor: a
    sample of their own, independent of the split and of the shadow sample."""
    return in_shadow_sample(salt + "\x00noise", key, share)
