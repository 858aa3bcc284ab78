"""The replica routing benchmark, small: bounded-load hashing keeps a single replica's
cache hit rate, round-robin loses much of it. Figures from the replicas' own /metrics; the
assertions are orderings with margin, never timings."""

from __future__ import annotations

import pytest

from kvmigrate.bench.fleet import FleetResult, FleetSettings, run_fleet

# Cache-bound: one replica's cache holds a quarter of the conversations in flight with room
# to spare, not all of them, as on real GPUs where KV memory is the limit.
SETTINGS = FleetSettings(
    conversations=32, turns=5, concurrency=8, cache_tokens=8000, time_scale=0.05, seed=3
)


@pytest.fixture(scope="module")
def results() -> dict[str, FleetResult]:
    return {s: run_fleet(s, SETTINGS) for s in ("single", "bounded_hash", "round_robin")}


@pytest.mark.slow
def test_hashing_keeps_the_single_replica_hit_rate_and_round_robin_does_not(
    results: dict[str, FleetResult],
) -> None:
    single, hashed, robin = (results[s] for s in ("single", "bounded_hash", "round_robin"))
    assert all(r.errors == 0 for r in (single, hashed, robin))
    assert single.hit_rate > 0.5
    # Which turns find their prefix still cached depends on how the 8 concurrent
    # conversations interleave, which a busy machine changes: 0.93 of the single replica's
    # rate was read beside two test runs and a CPU hog (0.95 was the bound).
    assert hashed.hit_rate >= 0.9 * single.hit_rate
    assert robin.hit_rate <= 0.75 * single.hit_rate
    assert hashed.hit_rate - robin.hit_rate >= 0.15


def test_hashing_keeps_load_within_the_bound(results: dict[str, FleetResult]) -> None:
    hashed = results["bounded_hash"]
    # every conversation has the same turns, so the conversation bound is the request bound
    assert hashed.request_max_mean <= 1.25 + 1e-9
    assert sum(hashed.requests) == 32 * 5
