"""A plan: the workload through fleets of each size, the smallest that meets the SLO, and
what it costs a month against the hosted API's bill for the same traffic."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvmigrate.plan.metrics import FleetFigures, figures
from kvmigrate.plan.simulate import Fleet, simulate
from kvmigrate.plan.workload import Workload
from kvmigrate.report.cost import HOURS_PER_MONTH, MONTH_S
from kvmigrate.report.model import Prices


@dataclass(frozen=True, slots=True)
class Costs:
    gpus_per_replica: int
    gpu_hour_usd: float
    hosted_monthly_usd: float | None  # the same traffic at hosted prices, scaled to 30 days

    def monthly_usd(self, replicas: int) -> float:
        return replicas * self.gpus_per_replica * self.gpu_hour_usd * HOURS_PER_MONTH


# The utilisation a fleet is sized to run at: under 70% pays for idle GPUs, over 80% leaves
# too little room for a burst or a lost replica before TTFT climbs.
UTILISATION_BAND = (0.70, 0.80)
DEFAULT_HEADROOM = 0.25  # buy 25% above the SLO's fleet: 80% of it is the band's top


def with_headroom(replicas: int, headroom: float) -> int:
    """Replicas to buy: `replicas` plus the margin, rounded up (rounded to 9 places first,
    so that 10 x 1.1 = 11.000000000000002 buys 11, not 12)."""
    return math.ceil(round(replicas * (1.0 + headroom), 9))


@dataclass(frozen=True, slots=True)
class Spare:
    """N+1: whether the fleet to buy still meets the SLO with one replica lost (a failure, or
    one drained for a rolling upgrade)."""

    fleet: int  # the replicas bought
    left: int  # the replicas serving once one is lost
    ttft_p95_s: float | None  # simulated for `left` replicas; None: not in the sweep
    holds: bool


@dataclass(frozen=True, slots=True)
class Plan:
    workload: Workload
    fleet: Fleet
    sizes: tuple[FleetFigures, ...]
    slo_p95_s: float | None
    costs: Costs
    notes: tuple[str, ...] = ()
    headroom: float = DEFAULT_HEADROOM  # the margin above the SLO's fleet, as a fraction

    @property
    def chosen(self) -> FleetFigures | None:
        """The smallest fleet whose TTFT p95 meets the SLO (None: none of them does)."""
        if self.slo_p95_s is None:
            return None
        return next((s for s in self.sizes if s.ttft_p95_s <= self.slo_p95_s), None)

    @property
    def buy(self) -> int | None:
        """The fleet to buy: the chosen size plus the headroom (None: nothing chosen)."""
        chosen = self.chosen
        return None if chosen is None else with_headroom(chosen.replicas, self.headroom)

    def meets(self, ttft_p95_s: float) -> bool | None:
        """Whether a TTFT p95 meets the SLO (None: no SLO given)."""
        return None if self.slo_p95_s is None else ttft_p95_s <= self.slo_p95_s

    @property
    def spare(self) -> Spare | None:
        """N+1 for the fleet to buy (None: nothing chosen). The sweep's own figure for one
        replica fewer when it simulated that size; otherwise it holds when one fewer is
        still at least the SLO's fleet (more replicas do not slow a fleet down)."""
        chosen, buy = self.chosen, self.buy
        if chosen is None or buy is None:
            return None
        left = buy - 1
        size = next((s for s in self.sizes if s.replicas == left), None)
        if size is None:
            return Spare(buy, left, None, left >= chosen.replicas)
        return Spare(buy, left, size.ttft_p95_s, bool(self.meets(size.ttft_p95_s)))


def hosted_monthly(workload: Workload, prices: Prices) -> float | None:
    """The report's hosted cost model: uncached, cached and output tokens at hosted
    prices, with the recorded cached tokens (none recorded: all uncached)."""
    if workload.basis_s <= 0:
        return None  # an untimed dataset has no month to scale to
    prompt = cached = output = 0
    for r in workload.requests:
        prompt += r.prompt_tokens
        cached += min(r.recorded_cached_tokens or 0, r.prompt_tokens)
        output += r.output_tokens
    usd = (
        (prompt - cached) * prices.input_per_m
        + cached * prices.cached_input_per_m
        + output * prices.output_per_m
    ) / 1e6
    return usd * MONTH_S / max(workload.basis_s, 1.0)


def sweep(
    workload: Workload,
    fleet: Fleet,
    sizes: Sequence[int],
    slo_p95_s: float | None,
    costs: Costs,
    progress: Callable[[int], None] | None = None,
    headroom: float = DEFAULT_HEADROOM,
) -> Plan:
    results = []
    for replicas in sorted(set(sizes)):
        results.append(figures(simulate(workload, fleet, replicas)))
        if progress is not None:
            progress(replicas)
    return Plan(workload, fleet, tuple(results), slo_p95_s, costs, headroom=headroom)


def parse_sizes(text: str) -> list[int]:
    """`4`, `1..16`, `1,2,4,8` or `2..16/2` (every second size)."""
    sizes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        span, _, stride = part.partition("/")
        low, dots, high = span.partition("..")
        try:
            first = int(low)
            last = int(high) if dots else first
            step = int(stride) if stride else 1
        except ValueError:
            raise ValueError(
                f"bad replica count {part!r}: use 4, 1..16, 1,2,4 or 2..16/2"
            ) from None
        if first < 1 or last < first or step < 1:
            raise ValueError(f"bad replica range {part!r}")
        sizes.extend(range(first, last + 1, step))
    if not sizes or max(sizes) > 4096:
        raise ValueError("give between 1 and 4096 replicas")
    return sorted(set(sizes))
