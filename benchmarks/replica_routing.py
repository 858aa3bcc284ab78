"""Prefix-cache-aware replica routing: bounded-load consistent hashing against round-robin.

Four emulated vLLM replicas, each with its own block prefix cache, behind the proxy; N
multi-turn conversations (each turn resends the whole history) go through the proxy under
each strategy. The hit rate is read from the replicas' own /metrics
(vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, in tokens) and compared with
one replica that gets every conversation and the fleet's whole cache budget (perfect
affinity). Load is the requests each replica finished (max / mean), and the proxy's
time-averaged in-flight requests per replica (max / mean).

    python benchmarks/replica_routing.py                      # cache-bound replicas
    python benchmarks/replica_routing.py --cache-tokens 0     # unlimited caches

Targets: hashing keeps >= 95% of the single replica's hit rate with load max/mean <= 1.25;
round-robin loses most of it once a replica's cache cannot hold every conversation.
"""

from __future__ import annotations

import argparse
import sys

from kvmigrate.bench.fleet import STRATEGIES, FleetResult, FleetSettings, run_fleet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--cache-tokens",
        type=int,
        default=16_000,
        help="one replica's prefix cache in tokens (0: unlimited); the single replica gets "
        "replicas times as much",
    )
    parser.add_argument("--time-scale", type=float, default=0.2)
    args = parser.parse_args()
    settings = FleetSettings(
        replicas=args.replicas,
        conversations=args.conversations,
        turns=args.turns,
        concurrency=args.concurrency,
        cache_tokens=args.cache_tokens,
        time_scale=args.time_scale,
    )
    print(
        f"{settings.replicas} replicas, {settings.conversations} conversations x "
        f"{settings.turns} turns, {settings.concurrency} at once, cache per replica: "
        f"{settings.cache_tokens or 'unlimited'} tokens",
        flush=True,
    )
    results: dict[str, FleetResult] = {}
    for strategy in STRATEGIES:
        results[strategy] = run_fleet(strategy, settings)
        print(f"  ran {strategy}", file=sys.stderr, flush=True)
    single = results["single"].hit_rate
    print(f"{'strategy':<14}{'hit rate':>9}{'vs single':>11}{'req max/mean':>14}"
          f"{'in-flight max/mean':>20}{'errors':>8}")  # fmt: skip
    for name, r in results.items():
        in_flight = "-" if name == "single" else f"{r.in_flight_max_mean:.2f}"
        print(
            f"{name:<14}{r.hit_rate:>9.3f}{r.hit_rate / single:>11.2f}"
            f"{r.request_max_mean:>14.2f}{in_flight:>20}{r.errors:>8}"
        )
    hashed, robin = results["bounded_hash"], results["round_robin"]
    ok = hashed.hit_rate >= 0.95 * single and hashed.request_max_mean <= 1.25
    ok = ok and robin.hit_rate < hashed.hit_rate
    print("targets met" if ok else "targets NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
