"""The decode-speed and TTFT-flatness sections as tables (text, md and html alike)."""

from __future__ import annotations

from kvmigrate.render import fmt
from kvmigrate.render.table import Table
from kvmigrate.report.model import Flatness, Report

DECODE_HEADERS = (
    "backend",
    "streams",
    "tok/s p50",
    "tok/s p50 95% CI",
    "tok/s p10",
    "TPOT p50",
    "TPOT p95",
    "chunk gap p50",
    "longest gap p95",
    "no usage",
)


def tps(value: float | None) -> str:
    return fmt.MISSING if value is None else f"{fmt.number(value, 1)} tok/s"


def span(low: float | None, high: float | None) -> str:
    """An interval as `[low, high]`, an unbounded end as `?`."""
    lo = "?" if low is None else fmt.number(low, 1)
    hi = "?" if high is None else fmt.number(high, 1)
    return f"[{lo}, {hi}]"


def decode(report: Report) -> Table:
    rows = [
        (
            d.backend,
            fmt.number(d.streams),
            tps(d.tps_p50),
            span(d.tps_p50_low, d.tps_p50_high),
            tps(d.tps_p10),
            fmt.ms(d.tpot_p50_ms),
            fmt.ms(d.tpot_p95_ms),
            fmt.ms(d.gap_p50_ms),
            fmt.ms(d.gap_max_p95_ms),
            fmt.number(d.no_usage),
        )
        for d in report.decode
    ]
    diff = report.decode_difference
    foot = (
        "Per stream, after the first token: output tokens per second, time per output "
        "token (TPOT), the mean gap between relayed chunks and the longest. A stream counts "
        "when its answer carries usage (stream_options.include_usage)."
    )
    if diff.difference is not None:
        foot = (
            f"{report.candidate} - {report.primary}, tok/s p50: "
            f"{diff.difference:+,.1f} tok/s, 95% CI {span(diff.low, diff.high)}. " + foot
        )
    note = "No streamed answer with decode timing in this window."
    return Table("decode", "Decode speed per stream", DECODE_HEADERS, rows, note, foot)


def decode_by_turn(report: Report) -> Table:
    p, c = report.primary, report.candidate
    headers = ("turn", f"{p} n", f"{p} tok/s p50", f"{p} TPOT p50",
               f"{c} n", f"{c} tok/s p50", f"{c} TPOT p50")  # fmt: skip
    rows = [
        (
            t.turn,
            fmt.number(t.primary_n),
            tps(t.primary_tps_p50),
            fmt.ms(t.primary_tpot_p50_ms),
            fmt.number(t.candidate_n),
            tps(t.candidate_tps_p50),
            fmt.ms(t.candidate_tpot_p50_ms),
        )
        for t in report.decode_by_turn
    ]
    note = "No streamed answer with decode timing in this window."
    return Table("decode_by_turn", "Decode speed by turn", headers, rows, note)


FLATNESS_HEADERS = (
    "backend",
    "calls",
    "conversations",
    "slope ms/turn",
    "slope 95% CI",
    "from turn 10 n",
    "from turn 10 p50",
    "from turn 10 p95",
    "p95 95% CI",
)


def flatness(report: Report) -> Table:
    rows = [_flat_cells(f) for f in report.flatness]
    foot = (
        "Slope: OLS of TTFT on the turn number, 95% interval from a cluster-robust standard "
        "error (clustered by conversation). The playbook asks for TTFT under 3 s even past "
        "10 turns: the p95 from turn 10 on, with its distribution-free 95% interval."
    )
    note = "No timed calls in this window."
    return Table("flatness", "TTFT flatness across turns", FLATNESS_HEADERS, rows, note, foot)


def _flat_cells(f: Flatness) -> tuple[str, ...]:
    slope = fmt.MISSING
    if f.slope_ms_per_turn is not None:
        slope = f"{f.slope_ms_per_turn:+,.1f}"
    ci = fmt.MISSING if f.slope_ms_per_turn is None else span(f.slope_low, f.slope_high)
    late_ci = fmt.MISSING if not f.late_n else span(f.late_p95_low, f.late_p95_high)
    return (
        f.backend,
        fmt.number(f.calls),
        fmt.number(f.conversations),
        slope,
        ci,
        fmt.number(f.late_n),
        fmt.ms(f.late_p50_ms),
        fmt.ms(f.late_p95_ms),
        late_ci,
    )
