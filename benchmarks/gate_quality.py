"""Print how often the promotion gates refuse a good candidate and let a bad one through.

Simulates rollouts that grow while the gate is looked at again and again (`--looks` times
over the planned size), as `rollout auto` does during a bake, until it decides or the
rollout reaches its planned size, or the sample size the gate first asked for when that is
more (up to 4x the plan). "Refused" means not promoted: Failed, or still waiting then.

- parity (min_parity 0.9): scored pairs are drawn from a labelled set built against the
  emulated backend (kvmigrate.parity.labelled, scored by the real comparators). The
  primary's noise floor and an equal candidate both draw noise-only pairs; a candidate
  "10 points worse" mixes in the injected divergences (a uniform mix of the six classes)
  until its lowest comparator sits 10 points under a perfect one (parity 0.90), and one
  "20 points worse" at 0.80.
- error rate (margin 1 point): the primary fails 2% of requests; the candidate as often,
  or 2 points more (4%).
- TTFT p95 (factor 1.5): log-normal TTFTs (median 300 ms); the candidate's the same, or
  1.5x (and 2x) slower.

Each conversation brings 4 requests to each backend; in the parity case 4 scored pairs,
and 2 noise pairs (rollout.noise_sample 0.5). Requests are independent draws: real
conversations correlate their turns, so real traffic needs somewhat more of them.

    .venv/bin/python benchmarks/gate_quality.py [--rollouts 500] [--looks 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.parity.compare import compare
from kvmigrate.parity.labelled import NOISE, build_labelled_set, http_poster
from kvmigrate.policies.error_gate import error_gate
from kvmigrate.policies.gate_model import GateConfig, GateResult
from kvmigrate.policies.parity_gate import parity_gate
from kvmigrate.policies.sequential import Verdict
from kvmigrate.policies.ttft_gate import ttft_gate
from kvmigrate.policies.window import RESERVOIR, BackendWindow, ComparatorCounts
from kvmigrate.serving import BackgroundServer

TURNS = 4
NOISE_PAIRS_PER_CONVERSATION = 2
Flags = tuple[frozenset[str], frozenset[str]]  # (applicable, disagreeing) comparators
# One look: conversations so far -> the gate's answer.
Look = Callable[[int], GateResult]


@dataclass
class Outcomes:
    """What a scenario's rollouts ended with."""

    verdicts: Counter[str] = field(default_factory=Counter)
    decided_at: list[int] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)

    def share(self, *verdicts: Verdict) -> float:
        total = sum(self.verdicts.values())
        return sum(self.verdicts[v.value] for v in verdicts) / total if total else 0.0


def run_rollout(look: Look, every: int, planned: int) -> tuple[Verdict, int, int | None]:
    """(verdict, conversations when it stopped, the total the gate first asked for). A
    rollout runs to its planned size, or on to what the gate first asked for when that is
    more (at most four times the plan)."""
    asked = None
    conversations = every
    while True:
        result = look(conversations)
        if result.verdict is not Verdict.INCONCLUSIVE:
            return result.verdict, conversations, asked
        if asked is None and result.needed_conversations is not None:
            asked = conversations + result.needed_conversations
        horizon = min(4 * planned, max(planned, asked or 0))
        if conversations >= horizon:
            return Verdict.INCONCLUSIVE, conversations, asked
        conversations = min(horizon, conversations + every)


def simulate(
    make_look: Callable[[random.Random], Look], runs: int, every: int, planned: int, seed: int
) -> Outcomes:
    outcomes = Outcomes()
    for run in range(runs):
        verdict, at, asked = run_rollout(
            make_look(random.Random(seed * 100_003 + run)), every, planned
        )
        outcomes.verdicts[verdict.value] += 1
        if verdict is not Verdict.INCONCLUSIVE:
            outcomes.decided_at.append(at)
        if asked is not None:
            outcomes.asked.append(asked)
    return outcomes


# Parity ------------------------------------------------------------------------------


def labelled_flags(seed: int) -> tuple[list[Flags], list[Flags]]:
    """(noise-only pairs, divergent pairs) as comparator flags, scored by the real engine."""
    settings = EmulatorSettings(profile="hosted", time_scale=0.0, noise=0.3)
    with BackgroundServer(lambda: build_app(settings)) as server:
        pairs = build_labelled_set(
            http_poster(server.url + "/v1"), "gpt-4o-mini", per_class=60, noise_pairs=400, seed=seed
        )
    noise: list[Flags] = []
    divergent: list[Flags] = []
    for pair in pairs:
        score = compare(pair.request, pair.primary, pair.candidate)
        if score.scorable:
            flags = (frozenset(score.applicable), frozenset(score.disagreements))
            (noise if pair.label == NOISE else divergent).append(flags)
    return noise, divergent


def true_parity(noise: Sequence[Flags], divergent: Sequence[Flags], mix: float) -> float:
    """The parity a candidate drawing `mix` of its pairs from `divergent` has, exactly."""

    def rates(share: float) -> dict[str, float]:
        applies: dict[str, float] = defaultdict(float)
        disagrees: dict[str, float] = defaultdict(float)
        for pool, weight in ((noise, 1 - share), (divergent, share)):
            for applicable, disagree in pool:
                for name in applicable:
                    applies[name] += weight / len(pool)
                    disagrees[name] += weight / len(pool) * (name in disagree)
        return {n: disagrees[n] / applies[n] for n in applies if applies[n] > 0}

    floor, candidate = rates(0.0), rates(mix)
    return 1 - max(0.0, *(candidate[n] - floor.get(n, 0.0) for n in candidate))


def mix_for(noise: Sequence[Flags], divergent: Sequence[Flags], parity: float) -> float:
    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        if true_parity(noise, divergent, middle) > parity:
            low = middle
        else:
            high = middle
    return high


def parity_look(
    noise: Sequence[Flags], divergent: Sequence[Flags], mix: float, config: GateConfig
) -> Callable[[random.Random], Look]:
    def make(rng: random.Random) -> Look:
        counts = {k: (Counter[str](), Counter[str]()) for k in ("candidate", "noise")}
        seen = [0, 0]

        def draw(kind: str, pool: Sequence[Flags]) -> None:
            applicable, disagree = rng.choice(pool)
            counts[kind][0].update(applicable)
            counts[kind][1].update(disagree & applicable)

        def look(conversations: int) -> GateResult:
            while seen[0] < conversations * TURNS:
                draw("candidate", divergent if rng.random() < mix else noise)
                seen[0] += 1
            while seen[1] < conversations * NOISE_PAIRS_PER_CONVERSATION:
                draw("noise", noise)
                seen[1] += 1
            (ca, cd), (na, nd) = counts["candidate"], counts["noise"]
            comparators = tuple(ComparatorCounts(n, ca[n], cd[n], na[n], nd[n]) for n in ca)
            window = BackendWindow(
                "candidate",
                seen[0],
                conversations,
                parity_samples=seen[0],
                noise_pairs=seen[1],
                noise_needed=20,
                comparators=comparators,
            )
            return parity_gate(window, config)

        return look

    return make


# Error rate and TTFT --------------------------------------------------------------------


def error_look(
    rate: float, primary_rate: float, config: GateConfig
) -> Callable[[random.Random], Look]:
    def make(rng: random.Random) -> Look:
        seen, errors = [0], [0, 0]  # requests so far; candidate, primary errors

        def look(conversations: int) -> GateResult:
            n = conversations * TURNS
            errors[0] += sum(rng.random() < rate for _ in range(n - seen[0]))
            errors[1] += sum(rng.random() < primary_rate for _ in range(n - seen[0]))
            seen[0] = n
            return error_gate(
                _w(n, conversations, errors[1]), _w(n, conversations, errors[0]), config
            )

        return look

    return make


def _w(
    requests: int, conversations: int, errors: int = 0, ttfts: tuple[float, ...] = ()
) -> BackendWindow:
    return BackendWindow("b", requests, conversations, errors, ttft_sample=ttfts)


def ttft_look(slower: float, config: GateConfig) -> Callable[[random.Random], Look]:
    median = 0.3

    def make(rng: random.Random) -> Look:
        samples: tuple[list[float], list[float]] = ([], [])

        def look(conversations: int) -> GateResult:
            while len(samples[0]) < conversations * TURNS:
                samples[0].append(slower * median * math.exp(rng.gauss(0, 0.6)))
                samples[1].append(median * math.exp(rng.gauss(0, 0.6)))
            # The window keeps a uniform sample of RESERVOIR values, as the recorder's does.
            cand, prim = (
                tuple(s if len(s) <= RESERVOIR else rng.sample(s, RESERVOIR)) for s in samples
            )
            n = len(samples[0])
            return ttft_gate(
                _w(n, conversations, ttfts=prim), _w(n, conversations, ttfts=cand), config
            )

        return look

    return make


# The report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    gate: str
    name: str
    bad: bool  # should be refused
    make: Callable[[random.Random], Look]
    planned: int


def report(scenario: Scenario, outcomes: Outcomes) -> str:
    promoted = outcomes.share(Verdict.PASSED)
    failed = outcomes.share(Verdict.FAILED)
    refused = 1 - promoted
    decided = statistics.median(outcomes.decided_at) if outcomes.decided_at else math.nan
    asked = statistics.median(outcomes.asked) if outcomes.asked else math.nan
    return (
        f"{scenario.gate:<10} {scenario.name:<22} refused {refused:6.1%} "
        f"(failed {failed:6.1%}, waiting {1 - promoted - failed:6.1%})  "
        f"decided at {decided:5.0f} conv. (median)  first asked for {asked:5.0f}"
    )


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    config = GateConfig(min_parity=0.9, min_conversations=0, min_requests=100)
    e, t = args.error_planned, args.ttft_planned
    found = [
        Scenario("error_rate", "equal (2%)", False, error_look(0.02, 0.02, config), e),
        Scenario("error_rate", "+2 points (4%)", True, error_look(0.04, 0.02, config), e),
        Scenario("ttft_p95", "equal", False, ttft_look(1.0, config), t),
        Scenario("ttft_p95", "x1.5", True, ttft_look(1.5, config), t),
        Scenario("ttft_p95", "x2", True, ttft_look(2.0, config), t),
    ]
    if "parity" not in args.gates.split(","):
        return found
    return parity_scenarios(args, config) + found


def parity_scenarios(args: argparse.Namespace, config: GateConfig) -> list[Scenario]:
    noise, divergent = labelled_flags(args.seed)
    mix10, mix20 = mix_for(noise, divergent, 0.90), mix_for(noise, divergent, 0.80)
    worse = true_parity(noise, divergent, mix10)
    print(
        f"labelled pairs: {len(noise)} noise-only, {len(divergent)} divergent; a candidate "
        f"10 points worse diverges on {mix10:.1%} of pairs (true parity {worse:.3f}), "
        f"20 points worse on {mix20:.1%}"
    )

    def parity(mix: float) -> Callable[[random.Random], Look]:
        return parity_look(noise, divergent, mix, config)

    p = args.parity_planned
    return [
        Scenario("parity", "equal (noise only)", False, parity(0.0), p),
        Scenario("parity", "10 points worse", True, parity(mix10), p),
        Scenario("parity", "20 points worse", True, parity(mix20), p),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=500, help="rollouts per scenario")
    parser.add_argument("--looks", type=int, default=40, help="looks at the gate per rollout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gates", default="parity,error_rate,ttft_p95", help="which to run")
    parser.add_argument("--parity-planned", type=int, default=600, help="conversations")
    parser.add_argument("--error-planned", type=int, default=4000, help="conversations")
    parser.add_argument("--ttft-planned", type=int, default=400, help="conversations")
    args = parser.parse_args()
    print(
        f"{args.rollouts} rollouts per scenario, {args.looks} looks each, "
        f"{TURNS} requests per conversation; planned sizes: parity {args.parity_planned}, "
        f"error rate {args.error_planned}, TTFT {args.ttft_planned} conversations"
    )
    for scenario in scenarios(args):
        if scenario.gate not in args.gates.split(","):
            continue
        every = max(1, scenario.planned // args.looks)
        outcomes = simulate(scenario.make, args.rollouts, every, scenario.planned, args.seed)
        print(report(scenario, outcomes), flush=True)


if __name__ == "__main__":
    main()
