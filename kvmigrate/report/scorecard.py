"""The playbook's production checklist as rows: each with its target, both arms' figures,
the interval of what is judged, and a status.

A status is read from the interval, never from the point estimate alone: met when the
whole 95% interval is on the good side of the target, missed when it is wholly on the
other, not enough evidence when it straddles it (or rests on fewer than `MIN_SAMPLES`),
and not measured, with the reason, when there is no figure at all. The GPU, cost and
users rows read figures from outside the records (`scorecard_inputs`)."""

from __future__ import annotations

import math
from collections.abc import Callable

from kvmigrate.intervals import Interval, log_ratio_interval
from kvmigrate.report.model import BackendSummary, DecodeSummary, Flatness, Report
from kvmigrate.report.scorecard_engine import report_inputs
from kvmigrate.report.scorecard_inputs import (
    CostInput,
    GpuInput,
    ScorecardInputs,
    UsersInput,
)
from kvmigrate.report.scorecard_model import ScorecardRow, Status

MIN_SAMPLES = 20  # fewer calls (streams, conversations) than this: no verdict
TTFT_TARGET_MS = 2000.0
TPS_TARGET = 50.0
LATE_TARGET_MS = 3000.0
GPU_BAND = (0.70, 0.80)
IMPROVEMENT_TARGET = 0.5

Bounds = tuple[float | None, float | None]


def below(low: float | None, high: float | None, limit: float) -> Status:
    """A figure that should be under `limit` (None: an unbounded end)."""
    if high is not None and high < limit:
        return Status.MET
    if low is not None and low >= limit:
        return Status.MISSED
    return Status.NOT_ENOUGH


def above(low: float | None, high: float | None, limit: float) -> Status:
    """A figure that should be over `limit`."""
    if low is not None and low > limit:
        return Status.MET
    if high is not None and high <= limit:
        return Status.MISSED
    return Status.NOT_ENOUGH


def at_least(low: float | None, high: float | None, limit: float) -> Status:
    """A figure that should reach `limit` (touching it counts)."""
    if low is not None and low >= limit:
        return Status.MET
    if high is not None and high < limit:
        return Status.MISSED
    return Status.NOT_ENOUGH


def within(low: float | None, high: float | None, band: tuple[float, float]) -> Status:
    """A figure that should lie in [band]: met when its whole interval does."""
    if low is not None and high is not None and band[0] <= low and high <= band[1]:
        return Status.MET
    if (high is not None and high < band[0]) or (low is not None and low > band[1]):
        return Status.MISSED
    return Status.NOT_ENOUGH


def scorecard(report: Report, inputs: ScorecardInputs | None = None) -> list[ScorecardRow]:
    """The checklist's rows in the playbook's order; `inputs` None: the GPU, cost and
    users rows read the report's own figures (report.scorecard_engine)."""
    inputs = inputs or report_inputs(report)
    backends = {b.backend: b for b in report.backends}
    p, c = backends.get(report.primary), backends.get(report.candidate)
    decode = {d.backend: d for d in report.decode}
    flat = {f.backend: f for f in report.flatness}
    return [
        ttft_row(p, c),
        tps_row(decode.get(report.primary), decode.get(report.candidate)),
        flat_row(flat.get(report.primary), flat.get(report.candidate)),
        gpu_row(inputs.gpu),
        cost_row(inputs.cost),
        improvement_row(p, c),
        users_row(inputs.users),
    ]


def _row(key: str, check: str, target: str, unit: str) -> Callable[..., ScorecardRow]:
    def make(
        primary: float | None,
        candidate: float | None,
        measure: str,
        estimate: float | None,
        bounds: Bounds,
        status: Status,
        reason: str = "",
        source: str = "",
    ) -> ScorecardRow:
        return ScorecardRow(
            key, check, target, unit, primary, candidate, measure, estimate, *bounds,
            status, reason, source,
        )  # fmt: skip

    return make


def _few(n: int, what: str) -> str:
    return f"only {n} {what} on the candidate; a verdict needs {MIN_SAMPLES}"


def ttft_row(p: BackendSummary | None, c: BackendSummary | None) -> ScorecardRow:
    make = _row("ttft", "TTFT under 2 s", "candidate TTFT p95 < 2000 ms", "ms")
    primary = p.ttft_p95_ms if p else None
    source = "report: headline, TTFT p95"
    if c is None or c.ttft_p95_ms is None:
        reason = "no streamed candidate answer in this window (TTFT needs a stream)"
        return make(primary, None, "candidate TTFT p95", None, (None, None),
                    Status.NOT_MEASURED, reason, source)  # fmt: skip
    bounds = (c.ttft_p95_low_ms, c.ttft_p95_high_ms)
    status, reason = below(*bounds, TTFT_TARGET_MS), ""
    if c.ttft_n < MIN_SAMPLES:
        status, reason = Status.NOT_ENOUGH, _few(c.ttft_n, "timed calls")
    return make(primary, c.ttft_p95_ms, "candidate TTFT p95", c.ttft_p95_ms, bounds, status,
                reason, source)  # fmt: skip


def tps_row(p: DecodeSummary | None, c: DecodeSummary | None) -> ScorecardRow:
    make = _row("tps", "Tokens per second per stream above 50", "candidate p50 > 50 tok/s",
                "tok/s")  # fmt: skip
    primary = p.tps_p50 if p else None
    source = "report: decode speed; metric kvmigrate_decode_tokens_per_second"
    measure = "candidate tokens/s per stream, p50"
    if c is None or c.tps_p50 is None:
        reason = "no candidate stream with decode timing in this window"
        if c is not None and c.no_usage:
            reason = (
                f"the candidate's {c.no_usage} streams carried no usage to count tokens: "
                "clients must ask for stream_options.include_usage"
            )
        return make(primary, None, measure, None, (None, None), Status.NOT_MEASURED, reason,
                    source)  # fmt: skip
    bounds = (c.tps_p50_low, c.tps_p50_high)
    status, reason = above(*bounds, TPS_TARGET), ""
    if c.streams < MIN_SAMPLES:
        status, reason = Status.NOT_ENOUGH, _few(c.streams, "streams")
    return make(primary, c.tps_p50, measure, c.tps_p50, bounds, status, reason, source)


def flat_row(p: Flatness | None, c: Flatness | None) -> ScorecardRow:
    make = _row("flat", "Turn-N latency flat (under 3 s past 10 turns)",
                "candidate TTFT p95 from turn 10 < 3000 ms", "ms")  # fmt: skip
    measure = "candidate TTFT p95 from turn 10"
    primary = p.late_p95_ms if p else None
    source = "report: TTFT flatness; the TTFT-by-turn chart"
    if c is None:
        reason = "no streamed candidate answer in this window"
        return make(primary, None, measure, None, (None, None), Status.NOT_MEASURED, reason,
                    source)  # fmt: skip
    reason = _slope_words(c)
    if not c.late_n:
        reason = f"no candidate conversation reached turn {c.late_turn}; {reason}"
        return make(primary, None, measure, None, (None, None), Status.NOT_ENOUGH, reason,
                    source)  # fmt: skip
    bounds = (c.late_p95_low, c.late_p95_high)
    status = below(*bounds, LATE_TARGET_MS)
    if c.late_n < MIN_SAMPLES:
        status, reason = Status.NOT_ENOUGH, f"{_few(c.late_n, 'calls from turn 10')}; {reason}"
    return make(primary, c.late_p95_ms, measure, c.late_p95_ms, bounds, status, reason, source)


def _slope_words(f: Flatness) -> str:
    if f.slope_ms_per_turn is None:
        return "no slope (one turn number only)"
    words = f"TTFT slope {f.slope_ms_per_turn:+.1f} ms/turn"
    if f.slope_low is None or f.slope_high is None:
        return words + " (too few conversations for an interval)"
    return words + f" [{f.slope_low:+.1f}, {f.slope_high:+.1f}]"


def gpu_row(gpu: GpuInput | None) -> ScorecardRow:
    make = _row("gpu", "GPU utilisation 70-80%", "candidate GPU utilisation in [70%, 80%]",
                "share")  # fmt: skip
    measure = "candidate mean GPU utilisation"
    if gpu is None or gpu.utilisation is None:
        reason = (gpu.missing if gpu else "") or (
            "no GPU utilisation source given to this report (a DCGM exporter or "
            "Prometheus URL scraped over the window)"
        )
        return make(None, None, measure, None, (None, None), Status.NOT_MEASURED, reason,
                    gpu.source if gpu else "")  # fmt: skip
    bounds = _or_point(gpu.low, gpu.high, gpu.utilisation)
    status = within(*bounds, GPU_BAND)
    return make(None, gpu.utilisation, measure, gpu.utilisation, (gpu.low, gpu.high), status,
                f"{gpu.samples} samples", gpu.source)  # fmt: skip


def cost_row(cost: CostInput | None) -> ScorecardRow:
    make = _row("cost", "Cost per token vs the hosted baseline",
                "candidate $/1M tokens < primary's", "$/1M tokens")  # fmt: skip
    measure = "candidate cost per 1M tokens"
    if cost is None or cost.candidate_usd_per_m is None or cost.hosted_usd_per_m is None:
        reason = (cost.missing if cost else "") or (
            "no cost-per-token figures given to this report (GPU-hour price against the "
            "tokens the candidate served)"
        )
        return make(cost.hosted_usd_per_m if cost else None, None, measure, None,
                    (None, None), Status.NOT_MEASURED, reason,
                    cost.source if cost else "")  # fmt: skip
    bounds = _or_point(cost.low, cost.high, cost.candidate_usd_per_m)
    status = below(*bounds, cost.hosted_usd_per_m)
    reason = ""
    if cost.break_even_utilisation is not None:
        reason = f"break-even at {cost.break_even_utilisation * 100:.0f}% GPU utilisation"
    return make(cost.hosted_usd_per_m, cost.candidate_usd_per_m, measure,
                cost.candidate_usd_per_m, (cost.low, cost.high), status, reason,
                cost.source)  # fmt: skip


def improvement_row(p: BackendSummary | None, c: BackendSummary | None) -> ScorecardRow:
    make = _row("ttft_improvement", "TTFT improvement 50%+",
                "1 - candidate / primary TTFT p50 >= 50%", "ms")  # fmt: skip
    measure = "TTFT p50 reduction"
    source = "report: headline and TTFT by turn"
    primary = p.ttft_p50_ms if p else None
    candidate = c.ttft_p50_ms if c else None
    if primary is None or candidate is None or p is None or c is None:
        whose = "primary" if primary is None else "candidate"
        reason = f"no streamed {whose} answer in this window to compare"
        return make(primary, candidate, measure, None, (None, None), Status.NOT_MEASURED,
                    reason, source)  # fmt: skip
    ratio = log_ratio_interval(
        candidate, _interval(c.ttft_p50_low_ms, c.ttft_p50_high_ms),
        primary, _interval(p.ttft_p50_low_ms, p.ttft_p50_high_ms),
    )  # fmt: skip
    estimate = 1.0 - candidate / primary if primary > 0 else None
    bounds = (_finite(1.0 - ratio.high), _finite(1.0 - ratio.low))
    status, reason = at_least(*bounds, IMPROVEMENT_TARGET), ""
    if min(p.ttft_n, c.ttft_n) < MIN_SAMPLES:
        n = min(p.ttft_n, c.ttft_n)
        status, reason = (
            Status.NOT_ENOUGH,
            f"only {n} timed calls on one arm; a verdict needs {MIN_SAMPLES}",
        )
    return make(primary, candidate, measure, estimate, bounds, status, reason, source)


def users_row(users: UsersInput | None) -> ScorecardRow:
    make = _row("users", "Customer satisfaction improving (users stay)",
                "candidate - primary better than 0", "")  # fmt: skip
    if users is None or users.primary is None or users.candidate is None:
        reason = (users.missing if users else "") or (
            "no satisfaction or retention figures given to this report (feedback scores "
            "joined to the arm that served each conversation)"
        )
        measure = users.measure if users else "satisfaction score"
        return make(users.primary if users else None, None, measure, None, (None, None),
                    Status.NOT_MEASURED, reason, users.source if users else "")  # fmt: skip
    difference = users.difference
    if difference is None:
        difference = users.candidate - users.primary
    judge = above if users.higher_is_better else _less_than_zero
    status, reason = judge(users.low, users.high, 0.0), ""
    n = min(users.primary_n, users.candidate_n)
    if n < MIN_SAMPLES:
        status = Status.NOT_ENOUGH
        reason = f"only {n} conversations on one arm; a verdict needs {MIN_SAMPLES}"
    return make(users.primary, users.candidate, f"{users.measure}: candidate - primary",
                difference, (users.low, users.high), status, reason, users.source)  # fmt: skip


def _less_than_zero(low: float | None, high: float | None, limit: float) -> Status:
    return below(low, high, limit)


def _or_point(low: float | None, high: float | None, point: float) -> Bounds:
    """A figure given without an interval is judged as its point (an exact reading)."""
    if low is None and high is None:
        return point, point
    return low, high


def _interval(low: float | None, high: float | None) -> Interval:
    return Interval(0.0 if low is None else low, math.inf if high is None else high)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
