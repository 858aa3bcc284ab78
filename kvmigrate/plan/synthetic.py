"""A synthetic multi-turn agent workload, for tests and benchmarks: conversations start as
a Poisson process, each turn resends the history plus a new message and waits for the
answer, then thinks for a while. Seeded, so every run is the same workload."""

from __future__ import annotations

import random

from kvmigrate.plan.workload import Request, Workload, chain_id


def agent_workload(
    conversations: int,
    turns: int,
    conversations_per_s: float,
    system_tokens: int = 2000,
    turn_tokens: int = 300,
    output_tokens: int = 150,
    think_s: float = 2.0,
    seed: int = 0,
) -> Workload:
    rng = random.Random(seed)
    requests = []
    start = 0.0
    for c in range(conversations):
        start += rng.expovariate(conversations_per_s)
        name = f"conv-{c}"
        prompt = system_tokens
        for turn in range(1, turns + 1):
            prompt += max(1, int(rng.uniform(0.5, 1.5) * turn_tokens))
            output = max(1, int(rng.uniform(0.5, 1.5) * output_tokens))
            gap = None if turn == 1 else rng.expovariate(1 / think_s) if think_s else 0.0
            requests.append(Request(name, turn, start, prompt, output, chain_id(name, 0), gap))
            prompt += output
    requests.sort(key=lambda r: (r.arrival_s, r.conversation, r.turn))
    return Workload(tuple(requests), "synthetic")
