"""A call's lease on its replica: which replica a URL is on, the load it adds while the
answer is open, and released exactly once (Upstream.send takes it; the answer's close ends
it)."""

from __future__ import annotations

import pytest

from kvmigrate.proxy.replicas import ReplicaSet

BASES = ("http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1", "http://10.0.0.2:8000/v1/pool")


@pytest.mark.parametrize(
    ("url", "index"),
    [
        ("http://10.0.0.1:8000/v1/chat/completions", 0),
        ("http://10.0.0.2:8000/v1/responses", 1),
        ("http://10.0.0.2:8000/v1/pool/chat/completions", 2),  # the longest base wins
        ("http://10.0.0.2:8000/v1", 1),
        ("http://10.0.0.2:8000/v10/chat/completions", None),  # a prefix, not a path below
        ("http://10.0.0.3:8000/v1/chat/completions", None),
        ("https://10.0.0.1:8000/v1/chat/completions", None),
    ],
)
def test_which_replica_a_url_is_on(url: str, index: int | None) -> None:
    assert ReplicaSet(BASES).index_of(url) == index


def test_a_lease_adds_load_until_released_once() -> None:
    replicas = ReplicaSet(BASES)
    first = replicas.lease(BASES[1] + "/chat/completions")
    second = replicas.lease(BASES[1] + "/chat/completions")
    other = replicas.lease(BASES[0] + "/chat/completions")
    assert first is not None
    assert second is not None
    assert other is not None
    assert replicas.loads == [1, 2, 0]
    first.release()
    first.release()  # an answer closed twice still ends one lease
    assert replicas.loads == [1, 1, 0]
    second.release()
    other.release()
    assert replicas.loads == [0, 0, 0]


def test_no_lease_where_there_is_nothing_to_pick() -> None:
    assert ReplicaSet(BASES[:1]).lease(BASES[0] + "/chat/completions") is None
    assert ReplicaSet(BASES).lease("http://elsewhere/v1/chat/completions") is None
