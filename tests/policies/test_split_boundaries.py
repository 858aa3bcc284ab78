"""The split and sampling buckets at their thresholds, and pinned across releases: a bucket
that moved after an upgrade would move live conversations between backends mid-way."""

from __future__ import annotations

import pytest

from kvmigrate.policies.split import bucket, in_candidate_share, in_noise_sample, in_shadow_sample

KEYS = [f"conv-{i}" for i in range(4)]


def test_buckets_are_pinned() -> None:
    # Figures from the release that introduced them; changing the hash, its byte order or
    # a salt suffix fails here, as it would reshuffle every running rollout.
    assert [bucket("salt", k) for k in KEYS] == [9323, 9921, 3402, 5612]
    assert [bucket("salt\x00shadow", k) for k in KEYS] == [4735, 1578, 7531, 764]
    assert [bucket("salt\x00noise\x00shadow", k) for k in KEYS] == [5283, 9071, 1234, 9529]


@pytest.mark.parametrize("key", KEYS)
def test_candidate_share_threshold_is_exclusive(key: str) -> None:
    b = bucket("salt", key)
    assert not in_candidate_share("salt", key, b / 100)  # bucket == threshold: outside
    assert in_candidate_share("salt", key, (b + 1) / 100)
    assert not in_candidate_share("salt", key, 0.0)
    assert in_candidate_share("salt", key, 100.0)


@pytest.mark.parametrize(
    ("sample", "salt"),
    [(in_shadow_sample, "salt\x00shadow"), (in_noise_sample, "salt\x00noise\x00shadow")],
)
@pytest.mark.parametrize("key", KEYS)
def test_sample_threshold_is_exclusive(sample: object, salt: str, key: str) -> None:
    assert callable(sample)
    b = bucket(salt, key)
    assert not sample("salt", key, b / 10_000)
    assert sample("salt", key, (b + 1) / 10_000)
    assert not sample("salt", key, 0.0)
    assert sample("salt", key, 1.0)
