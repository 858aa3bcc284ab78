"""Candidates against each other: for two candidates of one cohort, which does better on
error rate, TTFT p50 and parity, so whoever picks `rollout --candidate` can act on it.

Each measure is a difference, A minus B, with an always-valid interval (the gates' z,
`policies.sequential`, so looking again and again does not make a lead appear by chance):
Newcombe's interval for the error rates and for the parity disagreement rates, and for the
p50s the same construction (MOVER) over each p50's distribution-free interval. A lead is
declared only when the interval excludes zero; touching it is undecided, since a tie is no
reason to pick one. Pure functions over the windows the gates already read: each
candidate's own shadow or served traffic, in its cohort.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import combinations

from kvmigrate.intervals import Interval, newcombe_difference, quantile_interval
from kvmigrate.percentile import percentile
from kvmigrate.policies.gate_model import GateConfig, bounds
from kvmigrate.policies.sequential import Verdict, always_valid_z, more_needed, needed_scale
from kvmigrate.policies.window import BackendWindow

# A minus B and its interval, with each sample `scale` times as large at the same rates.
Estimator = Callable[[float], tuple[float, Interval]]


class Lead(StrEnum):
    A = "a_better"
    B = "b_better"
    UNDECIDED = "undecided"


@dataclass(frozen=True, slots=True)
class PairDifference:
    """One measure of candidate `a` against candidate `b`: the estimate of a minus b (error
    rate and parity as fractions, TTFT in ms), its interval (None where unbounded or not
    yet known), which one leads, and the conversations each still needs at the observed
    rates (None when more traffic would not decide it, or it is decided)."""

    a: str
    b: str
    measure: str
    lead: Lead
    detail: str
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    needed_conversations: int | None = None

    @property
    def leader(self) -> str | None:
        return {Lead.A: self.a, Lead.B: self.b}.get(self.lead)


def lead(low: float, high: float, lower_is_better: bool) -> Lead:
    """Which of A and B leads, from the interval of A minus B: only an interval wholly on
    one side of zero says so."""
    if high < 0:
        return Lead.A if lower_is_better else Lead.B
    if low > 0:
        return Lead.B if lower_is_better else Lead.A
    return Lead.UNDECIDED


def compare_candidates(
    windows: Sequence[BackendWindow], config: GateConfig
) -> list[PairDifference]:
    """Every pair of `windows` (in their order) on every measure."""
    return [
        difference
        for a, b in combinations(windows, 2)
        for difference in (
            error_rate_difference(a, b, config),
            ttft_p50_difference(a, b, config),
            parity_difference(a, b, config),
        )
    ]


def error_rate_difference(a: BackendWindow, b: BackendWindow, config: GateConfig) -> PairDifference:
    if min(a.requests, b.requests) < config.min_requests:
        return _waiting(a, b, "error_rate", _too_few(a.requests, b.requests, config))

    def estimate(scale: float) -> tuple[float, Interval]:
        na, nb = max(1, round(a.requests * scale)), max(1, round(b.requests * scale))
        ka, kb = round(a.error_rate * na), round(b.error_rate * nb)
        return newcombe_difference(ka, na, kb, nb, _z(na, config), _z(nb, config))

    def words(d: float, iv: Interval) -> str:
        return (
            f"{a.backend} {a.error_rate:.2%} - {b.backend} {b.error_rate:.2%} = "
            f"{_points(d)} [{_points(iv.low)}, {_points(iv.high)}]"
        )

    return _judged(a, b, "error_rate", estimate, words, lower_is_better=True)


def ttft_p50_difference(a: BackendWindow, b: BackendWindow, config: GateConfig) -> PairDifference:
    # As the TTFT gate: streamed answers give TTFT, else total latency is what users wait.
    streamed = bool(a.ttft_sample and b.ttft_sample)
    measure = "TTFT p50" if streamed else "latency p50"
    sa = sorted(a.ttft_sample if streamed else a.latency_sample)
    sb = sorted(b.ttft_sample if streamed else b.latency_sample)
    if min(a.requests, b.requests) < config.min_requests:
        return _waiting(a, b, "ttft_p50", _too_few(a.requests, b.requests, config))
    if not sa or not sb:  # every request failed: no time to compare
        missing = " or ".join(w.backend for w, s in ((a, sa), (b, sb)) if not s)
        return _waiting(a, b, "ttft_p50", f"no {measure} recorded yet for {missing}")
    pa, pb = _p50(sa), _p50(sb)

    def estimate(scale: float) -> tuple[float, Interval]:
        ia = quantile_interval(sa, 0.5, _z(len(sa) * scale, config), len(sa) * scale)
        ib = quantile_interval(sb, 0.5, _z(len(sb) * scale, config), len(sb) * scale)
        d = (pa - pb) * 1000
        down = math.hypot(pa - ia.low, ib.high - pb) * 1000
        up = math.hypot(ia.high - pa, pb - ib.low) * 1000
        return d, Interval(d - down, d + up)

    def words(d: float, iv: Interval) -> str:
        return (
            f"{a.backend} {measure} {pa * 1000:.0f} ms - {b.backend} {pb * 1000:.0f} ms = "
            f"{d:+.0f} ms [{_ms(iv.low)}, {_ms(iv.high)}]"
        )

    return _judged(a, b, "ttft_p50", estimate, words, lower_is_better=True)


def parity_difference(a: BackendWindow, b: BackendWindow, config: GateConfig) -> PairDifference:
    """Noise-free by construction: both candidates are held to the same primary answers, so
    the primary's own variation cancels out of the difference. The pairs are pooled over
    the comparators both have scores for."""
    na, ka, nb, kb = _pooled(a, b)
    need = config.min_parity_samples
    if min(na, nb) < need:
        detail = (
            f"need {need} scored pairs of each (rollout.gates.min_parity_samples) on common "
            f"comparators; have {na} and {nb}"
        )
        return _waiting(a, b, "parity", detail)

    def estimate(scale: float) -> tuple[float, Interval]:
        sa, sb = max(1, round(na * scale)), max(1, round(nb * scale))
        da, db = round(ka / na * sa), round(kb / nb * sb)
        za, zb = (always_valid_z(n, config.confidence, need) for n in (sa, sb))
        # B's disagreement minus A's is A's parity minus B's.
        return newcombe_difference(db, sb, da, sa, zb, za)

    def words(d: float, iv: Interval) -> str:
        return (
            f"{a.backend} parity {1 - ka / na:.3f} - {b.backend} {1 - kb / nb:.3f} = "
            f"{d:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"
        )

    return _judged(a, b, "parity", estimate, words, lower_is_better=False)


def _judged(
    a: BackendWindow,
    b: BackendWindow,
    measure: str,
    estimate: Estimator,
    words: Callable[[float, Interval], str],
    lower_is_better: bool,
) -> PairDifference:
    def verdict_at(scale: float) -> Verdict:
        _, iv = estimate(scale)
        decided = lead(iv.low, iv.high, lower_is_better) is not Lead.UNDECIDED
        return Verdict.PASSED if decided else Verdict.INCONCLUSIVE

    d, interval = estimate(1.0)
    which = lead(interval.low, interval.high, lower_is_better)
    detail = words(d, interval)
    more = None
    if which is Lead.UNDECIDED:
        more = more_needed(max(a.conversations, b.conversations), needed_scale(verdict_at))
        detail += ": undecided" + (
            "; too close to call to say how much more traffic it needs"
            if more is None
            else f"; about {more} more conversations each at the observed rates"
        )
    else:
        detail += f": {a.backend if which is Lead.A else b.backend} better"
    return PairDifference(
        a.backend,
        b.backend,
        measure,
        which,
        detail,
        estimate=round(d, 6),
        needed_conversations=more,
        **bounds(interval),
    )


def _waiting(a: BackendWindow, b: BackendWindow, measure: str, detail: str) -> PairDifference:
    return PairDifference(a.backend, b.backend, measure, Lead.UNDECIDED, detail)


def _too_few(have_a: int, have_b: int, config: GateConfig) -> str:
    return (
        f"need {config.min_requests} requests of each (rollout.gates.min_requests); "
        f"have {have_a} and {have_b}"
    )


def _pooled(a: BackendWindow, b: BackendWindow) -> tuple[int, int, int, int]:
    """Scored pairs and disagreements of each, over the comparators both were scored on."""
    of_b = {c.name: c for c in b.comparators if c.candidate_n}
    common = [(c, of_b[c.name]) for c in a.comparators if c.candidate_n and c.name in of_b]
    return (
        sum(x.candidate_n for x, _ in common),
        sum(x.candidate_disagree for x, _ in common),
        sum(y.candidate_n for _, y in common),
        sum(y.candidate_disagree for _, y in common),
    )


def _z(n: float, config: GateConfig) -> float:
    return always_valid_z(n, config.confidence, config.min_requests)


def _p50(ordered: Sequence[float]) -> float:
    value = percentile(ordered, 50)
    assert value is not None  # a sample that is not empty
    return value


def _points(rate: float) -> str:
    return f"{rate * 100:+.2f} pts"


def _ms(value: float) -> str:
    return f"{value:+.0f} ms" if math.isfinite(value) else "unbounded"
