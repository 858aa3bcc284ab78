"""Cost per token of each arm over the report's window: the hosted price table against the
candidate's GPU-hours, over the tokens each arm actually answered, and the GPU utilisation
at which the two cost the same (the break-even).

Self-hosted cost is what the GPUs cost while they ran, whatever they did: GPUs x hours x
`--gpu-hour-price`. Spread over more tokens it costs less per token, so it falls as the
load (and with it the GPUs' utilisation) rises; the hosted price per token does not. With
a utilisation u measured over the window, serving the same tokens per GPU-hour at u' would
cost (u / u') as much per token, so the break-even utilisation is u x self-hosted / hosted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvmigrate.report.cost import hosted_usd
from kvmigrate.report.model import Prices
from kvmigrate.report.rows import Row

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class ArmCost:
    backend: str
    arm: str  # "primary" or "candidate"
    requests: int  # answered (status below 400), serve and shadow alike
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    hosted_usd: float | None  # these tokens at the hosted price table
    hosted_usd_per_m: float | None  # per million tokens (input + output)
    self_hosted_usd: float | None = None  # the candidate: its GPU-hours at the hour price
    self_hosted_usd_per_m: float | None = None


@dataclass(frozen=True, slots=True)
class GpuCount:
    gpus: int | None
    source: str  # where the count came from, or why there is none


@dataclass(frozen=True, slots=True)
class CostFigures:
    arms: tuple[ArmCost, ...] = ()
    gpu_hour_price: float = 0.0
    gpus: int | None = None
    gpus_source: str = ""
    hours: float | None = None  # how long the GPUs count as running
    hours_source: str = ""
    gpu_hours: float | None = None
    # Self-hosted / hosted cost of the candidate's tokens: the load multiple at which the
    # two cost the same (below 1: self-hosting is already cheaper).
    break_even_load: float | None = None
    utilisation_pct: float | None = None  # measured over the window
    break_even_utilisation_pct: float | None = None  # over 100: not reachable
    break_even_tokens_per_gpu_s: float | None = None  # tokens (in + out) per GPU-second
    reason: str = ""  # why the self-hosted side is missing


def gpu_count(
    configured: int, seen: int | None, answering: int, per_replica: int, replicas: int
) -> GpuCount:
    """The GPUs serving the candidate: `gpu.gpus`, else the GPU source's count, else the
    replicas that answered a scrape (or the configured replicas) times `gpus_per_replica`."""
    if configured:
        return GpuCount(configured, "config (gpu.gpus)")
    if seen:
        return GpuCount(seen, "the GPU source's count")
    if answering:
        scraped = f"{answering} scraped replica{_s(answering)}"
        return GpuCount(answering * per_replica, f"{scraped} x {per_replica}")
    if replicas:
        listed = f"{replicas} configured replica{_s(replicas)}"
        return GpuCount(replicas * per_replica, f"{listed} x {per_replica}")
    return GpuCount(None, "no replica of the candidate is configured")


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def hours_running(scrape_span_s: float | None, rows: Sequence[Row]) -> tuple[float | None, str]:
    """How long the candidate's GPUs count as running in the window: between its first and
    last readable scrape, else between its first and last answer."""
    if scrape_span_s:
        return scrape_span_s / HOUR_S, "between the first and last scrape"
    if not rows:
        return None, "no answer from the candidate in this window"
    span = rows[-1].ts + (rows[-1].latency_ms or 0.0) / 1000.0 - rows[0].ts
    if span <= 0:
        return None, "one answer from the candidate: no span to count GPU-hours over"
    return span / HOUR_S, "between the candidate's first and last answer"


def arm_cost(rows: Sequence[Row], backend: str, arm: str, prices: Prices) -> ArmCost:
    answered = [r for r in rows if r.backend == backend and r.status is not None and r.status < 400]
    prompt = sum(r.prompt_tokens or 0 for r in answered)
    output = sum(r.completion_tokens or 0 for r in answered)
    hosted = hosted_usd(answered, prices) if answered else None
    tokens = prompt + output
    return ArmCost(
        backend=backend,
        arm=arm,
        requests=len(answered),
        input_tokens=prompt,
        cached_tokens=sum(min(r.cached_tokens or 0, r.prompt_tokens or 0) for r in answered),
        output_tokens=output,
        hosted_usd=hosted,
        hosted_usd_per_m=hosted / tokens * 1e6 if hosted is not None and tokens else None,
    )


def cost_per_token(
    rows: Sequence[Row],
    primary: str,
    candidate: str,
    prices: Prices,
    gpus: GpuCount,
    hours: tuple[float | None, str],
    utilisation_pct: float | None = None,
) -> CostFigures:
    """Each arm's cost per token over `rows` (the window's, in time order, no noise calls)."""
    first = arm_cost(rows, primary, "primary", prices)
    own = arm_cost(rows, candidate, "candidate", prices)
    span, span_source = hours
    base = CostFigures(
        arms=(first, own),
        gpu_hour_price=prices.gpu_per_hour,
        gpus=gpus.gpus,
        gpus_source=gpus.source,
        hours=span,
        hours_source=span_source,
        utilisation_pct=utilisation_pct,
    )
    tokens = own.input_tokens + own.output_tokens
    reason = _missing(gpus, hours, tokens)
    if reason or gpus.gpus is None or span is None:
        return replace(base, reason=reason)
    gpu_hours = gpus.gpus * span
    self_hosted = gpu_hours * prices.gpu_per_hour
    own = replace(
        own, self_hosted_usd=self_hosted, self_hosted_usd_per_m=self_hosted / tokens * 1e6
    )
    load = self_hosted / own.hosted_usd if own.hosted_usd else None
    rate = tokens / (span * HOUR_S) / gpus.gpus
    return replace(
        base,
        arms=(first, own),
        gpu_hours=gpu_hours,
        break_even_load=load,
        break_even_utilisation_pct=(
            utilisation_pct * load if utilisation_pct is not None and load is not None else None
        ),
        break_even_tokens_per_gpu_s=rate * load if load is not None else None,
        reason="" if load is not None else "the hosted price of the candidate's tokens is 0",
    )


def _missing(gpus: GpuCount, hours: tuple[float | None, str], tokens: int) -> str:
    if gpus.gpus is None:
        return gpus.source
    if hours[0] is None:
        return hours[1]
    if not tokens:
        return "the candidate answered no tokens in this window"
    return ""
