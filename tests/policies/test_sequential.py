"""The always-valid intervals the gates decide on, and the interval maths under them.

Coverage is checked by seeded simulation: deterministic, and it fails if the boundary is
made a fixed-sample one (which looked at every few samples covers far less than 95%)."""

from __future__ import annotations

import math
import random

import pytest

from kvmigrate.intervals import Interval, log_ratio_interval, quantile_interval, wilson, z_for
from kvmigrate.policies.sequential import (
    Verdict,
    always_valid_z,
    judge,
    more_needed,
    needed_scale,
)


def test_the_always_valid_z_is_wider_than_a_fixed_one_and_tightest_where_tuned() -> None:
    fixed = z_for(0.95)
    zs = {n: always_valid_z(n, 0.95, 100) for n in (10, 30, 100, 1000, 10_000, 1_000_000)}
    assert all(z > fixed for z in zs.values())
    assert min(zs, key=zs.__getitem__) == 100
    assert 2.9 < zs[100] < 3.2  # about 1.6 times a fixed interval's width there
    assert zs[1_000_000] < 4.3  # it widens only as sqrt(log n)
    assert always_valid_z(100, 0.99, 100) > zs[100]


@pytest.mark.parametrize(("z_of", "least"), [("always_valid", 0.95), ("fixed", 0.0)])
def test_a_wilson_interval_looked_at_every_ten_samples_keeps_its_coverage(
    z_of: str, least: float
) -> None:
    # 300 streams of 2,000 Bernoulli(0.3) draws, the interval checked after every 10: the
    # share of streams whose interval never missed 0.3 at any look.
    rng = random.Random(7)
    held = 0
    for _ in range(300):
        k, ok = 0, True
        for n in range(1, 2001):
            k += rng.random() < 0.3
            if n % 10 == 0:
                z = always_valid_z(n, 0.95, 100) if z_of == "always_valid" else z_for(0.95)
                interval = wilson(k, n, z)
                ok = ok and interval.low <= 0.3 <= interval.high
        held += ok
    if z_of == "always_valid":
        assert held / 300 >= least
    else:
        assert held / 300 < 0.8  # why the gates need it: fixed intervals peeked at fail


def test_a_quantile_interval_of_one_repeated_value_is_that_value() -> None:
    assert quantile_interval((0.2,) * 1000, 0.95, 3.0, 1000) == Interval(0.2, 0.2)


def test_a_sample_too_small_to_bound_a_p95_from_above_says_so() -> None:
    values = tuple(float(i) for i in range(20))
    interval = quantile_interval(values, 0.95, 3.0, 20)
    assert interval.high == math.inf
    assert interval.low <= 19.0


def test_a_p95_interval_covers_the_true_p95() -> None:
    rng = random.Random(3)
    covered = 0
    for _ in range(400):
        values = tuple(sorted(rng.random() for _ in range(400)))
        interval = quantile_interval(values, 0.95, z_for(0.95), 400)
        covered += interval.low <= 0.95 <= interval.high
    assert covered / 400 >= 0.94


def test_more_samples_drawn_alike_narrow_a_quantile_interval() -> None:
    rng = random.Random(1)
    values = tuple(sorted(rng.random() for _ in range(500)))
    now, later = (quantile_interval(values, 0.95, 3.0, n) for n in (500, 5000))
    assert now.low <= later.low <= later.high <= now.high
    assert later.high - later.low < now.high - now.low


def test_a_ratio_interval_from_point_intervals_is_the_exact_ratio() -> None:
    # 0.375 / 0.25 = 1.5 exactly: no log and exp round trip may move it off a threshold.
    assert log_ratio_interval(0.375, Interval(0.375, 0.375), 0.25, Interval(0.25, 0.25)) == (
        Interval(1.5, 1.5)
    )


def test_a_ratio_interval_holds_the_ratio_and_widens_with_either_side() -> None:
    top, bottom = Interval(0.9, 1.1), Interval(0.45, 0.55)
    ratio = log_ratio_interval(1.0, top, 0.5, bottom)
    assert ratio.low < 2.0 < ratio.high
    wider = log_ratio_interval(1.0, Interval(0.8, 1.2), 0.5, bottom)
    assert wider.low < ratio.low
    assert wider.high > ratio.high
    assert log_ratio_interval(1.0, Interval(0.9, math.inf), 0.5, bottom).high == math.inf
    assert log_ratio_interval(1.0, top, 0.5, Interval(0.0, 0.6)).high == math.inf


def test_needed_scale_finds_where_the_verdict_turns() -> None:
    def verdict_at(scale: float) -> Verdict:
        return judge(0.0, 0.05 / math.sqrt(scale), 0.01, higher_is_better=False)

    scale = needed_scale(verdict_at)
    assert scale is not None
    assert 24.0 <= scale <= 25.0 * 1.02  # the top reaches 0.01 at 25x the evidence
    assert verdict_at(scale) is Verdict.PASSED
    assert needed_scale(lambda _s: Verdict.INCONCLUSIVE) is None
    assert needed_scale(lambda _s: Verdict.FAILED) == 1.0
    assert more_needed(40, scale) == math.ceil(40 * scale) - 40
    assert more_needed(40, None) is None


@pytest.mark.parametrize(
    ("n", "confidence", "tuned_for"),
    [(1, 0.95, 1), (0.5, 0.95, 0.5), (1.5, 0.95, 1.5), (30, 0.95, 30), (300, 0.95, 30),
     (10, 0.99, 300), (1e6, 0.9, 1000)],
)  # fmt: skip
def test_the_always_valid_z_is_the_normal_mixture_boundary(
    n: float, confidence: float, tuned_for: float
) -> None:
    # Howard et al. (2021), the two-sided normal-mixture boundary: intrinsic time v = n rho^2,
    # rho^2 chosen so the boundary is tightest at `tuned_for` samples; n and tuned_for below 1
    # count as 1 (one sample is the least an interval is made of).
    alpha = 1.0 - confidence
    rho2 = (-2.0 * math.log(alpha) + math.log(1.0 - 2.0 * math.log(alpha))) / max(1.0, tuned_for)
    v = max(1.0, n) * rho2
    expected = math.sqrt((v + 1.0) / v * 2.0 * math.log(math.sqrt(v + 1.0) / alpha))
    assert always_valid_z(n, confidence, tuned_for) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("turns_at", [1.0, 1.3, 1.9, 7.0, 999.0])
def test_needed_scale_is_within_two_percent_above_where_the_verdict_turns(turns_at: float) -> None:
    def verdict_at(scale: float) -> Verdict:
        return Verdict.PASSED if scale >= turns_at else Verdict.INCONCLUSIVE

    scale = needed_scale(verdict_at)
    assert scale is not None
    assert turns_at <= scale <= turns_at * 1.02


@pytest.mark.parametrize(
    ("have", "scale", "more"), [(40, 1.0, 0), (0, 3.0, 0), (10, 1.05, 1), (10, 2.0, 10)]
)
def test_more_needed_is_what_the_scale_adds(have: int, scale: float, more: int) -> None:
    assert more_needed(have, scale) == more
