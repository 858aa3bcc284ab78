"""Monthly cost at the observed traffic: hosted per-token prices against GPU-hours."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from kvmigrate.exchange import Role
from kvmigrate.report.model import CostProjection, Prices
from kvmigrate.report.rows import Row

MONTH_S = 30 * 86_400.0
HOURS_PER_MONTH = 730.0
PEAK_BUCKET_S = 60.0
GIVEN = "given with --gpu-tokens-per-s"
# The shadow candidate only ever handled the load it was sent: its peak is a floor on what
# a GPU sustains, so the GPU count from it is a ceiling. Say so, and how to do better.
OBSERVED = "the candidate's observed peak, a lower bound"
SET_THROUGHPUT = (
    "GPUs needed is an upper bound: the shadow candidate only handled the load it was sent, "
    "so its peak understates what a GPU sustains. Set --gpu-tokens-per-s to the output "
    "tokens/s that `kvmigrate bench --concurrency N` prints for the candidate."
)


def project_cost(rows: Sequence[Row], candidate: str, prices: Prices) -> CostProjection:
    """Scale the served traffic of the window to 30 days and price it both ways.

    Served (role serve) calls are the clients' real traffic, whichever backend answered;
    shadow copies are the experiment's cost, not the workload's."""
    served = [r for r in rows if r.role == Role.SERVE and r.status is not None and r.status < 400]
    if not served:
        return CostProjection(prices=prices)
    span = max(served[-1].ts - served[0].ts + (served[-1].latency_ms or 0.0) / 1000.0, 1.0)
    scale = MONTH_S / span
    prompt, cached, written = _prompt_split(served)
    output = sum(r.completion_tokens or 0 for r in served)
    hosted = hosted_usd(served, prices)
    demand = output / span
    capacity, source = prices.gpu_tokens_per_s, GIVEN
    if capacity is None:
        capacity, source = _observed_peak(rows, candidate), OBSERVED
    gpus = max(prices.min_gpus, math.ceil(demand / capacity)) if capacity else None
    self_hosted = gpus * prices.gpu_per_hour * HOURS_PER_MONTH if gpus is not None else None
    hosted_monthly = hosted * scale
    return CostProjection(
        basis_s=span,
        monthly_requests=len(served) * scale,
        monthly_input_tokens=prompt * scale,
        monthly_cached_tokens=cached * scale,
        monthly_cache_write_tokens=written * scale,
        monthly_output_tokens=output * scale,
        hosted_monthly_usd=hosted_monthly,
        demand_tokens_per_s=demand,
        gpu_tokens_per_s=capacity or None,
        throughput_source=source if capacity else "no candidate output measured",
        gpus=gpus,
        self_hosted_monthly_usd=self_hosted,
        savings_monthly_usd=None if self_hosted is None else hosted_monthly - self_hosted,
        prices=prices,
    )


def hosted_usd(rows: Sequence[Row], prices: Prices) -> float:
    """What the hosted API bills (or would bill) for these calls' tokens."""
    prompt, cached, written = _prompt_split(rows)
    output = sum(r.completion_tokens or 0 for r in rows)
    return (
        (prompt - cached - written) * prices.input_per_m
        + cached * prices.cached_input_per_m
        + written * prices.cache_write_price
        + output * prices.output_per_m
    ) / 1e6


def _prompt_split(served: Sequence[Row]) -> tuple[int, int, int]:
    """(prompt tokens, of them read from the cache, of them written to it). A row's reads
    and writes are capped at its prompt, so a malformed usage cannot price below zero."""
    prompt = cached = written = 0
    for r in served:
        total = r.prompt_tokens or 0
        read = min(r.cached_tokens or 0, total)
        prompt += total
        cached += read
        written += min(r.cache_write_tokens or 0, total - read)
    return prompt, cached, written


def _observed_peak(rows: Sequence[Row], candidate: str) -> float:
    """The candidate's highest output rate over one-minute buckets (serve and shadow): what
    it demonstrably handled, so a floor on what it can handle."""
    done = [r for r in rows if r.backend == candidate and r.completion_tokens]
    if not done:
        return 0.0
    span = max(done[-1].ts - done[0].ts, 1.0)
    if span < PEAK_BUCKET_S:
        return sum(r.completion_tokens or 0 for r in done) / span
    buckets: dict[int, int] = defaultdict(int)
    for r in done:
        buckets[int(r.ts // PEAK_BUCKET_S)] += r.completion_tokens or 0
    return max(buckets.values()) / PEAK_BUCKET_S
