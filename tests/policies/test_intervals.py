"""The interval functions the gates and the parity noise floor read, against published
figures (Newcombe 1998, both papers) and the definitions they implement."""

from __future__ import annotations

import math

import pytest

from kvmigrate.intervals import (
    Interval,
    log_ratio_interval,
    newcombe_difference,
    quantile_interval,
    wilson,
    z_for,
)

Z95 = 1.959963984540054


@pytest.mark.parametrize(
    ("confidence", "z"),
    [(0.95, Z95), (0.99, 2.5758293035489), (0.5, 0.6744897501960817), (0.8, 1.2815515655446)],
)
def test_z_is_the_two_sided_normal_quantile(confidence: float, z: float) -> None:
    assert z_for(confidence) == pytest.approx(z, rel=1e-12)


# Newcombe, "Two-sided confidence intervals for the single proportion" (1998), method 3.
@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_the_published_intervals(k: int, n: int, low: float, high: float) -> None:
    got = wilson(k, n, Z95)
    assert (round(got.low, 4), round(got.high, 4)) == (low, high)


@pytest.mark.parametrize(
    ("k", "n", "z"), [(5, 10, Z95), (81, 263, Z95), (1, 1000, 3.0), (7, 9, 1.0), (3, 4, 2.5)]
)
def test_wilson_bounds_solve_the_score_equation(k: int, n: int, z: float) -> None:
    # Each bound p satisfies (k/n - p)^2 = z^2 p (1 - p) / n, the low one under k/n.
    got = wilson(k, n, z)
    assert 0.0 < got.low < k / n < got.high < 1.0
    for p in (got.low, got.high):
        assert (k / n - p) ** 2 == pytest.approx(z * z * p * (1 - p) / n, rel=1e-9)


@pytest.mark.parametrize(("k", "n"), [(0, 0), (3, -1)])
def test_wilson_without_a_sample_is_the_whole_range(k: int, n: int) -> None:
    assert wilson(k, n, Z95) == Interval(0.0, 1.0)


@pytest.mark.parametrize("n", [1, 2, 10, 263])
@pytest.mark.parametrize("z", [1.0, Z95, 3.0])
def test_wilson_at_none_and_all_is_exactly_zero_or_one(n: int, z: float) -> None:
    # The closed forms at the edges: 0 of n spans [0, z^2 / (n + z^2)], n of n the shadow.
    none, every = wilson(0, n, z), wilson(n, n, z)
    assert none.low == 0.0
    assert every.high == 1.0
    assert none.high == pytest.approx(z * z / (n + z * z), rel=1e-12)
    assert every.low == pytest.approx(n / (n + z * z), rel=1e-12)


# Newcombe, "Interval estimation for the difference between independent proportions" (1998),
# method 10, Table II.
@pytest.mark.parametrize(
    ("k1", "n1", "k2", "n2", "low", "high"),
    [
        (56, 70, 48, 80, 0.0524, 0.3339),
        (9, 10, 3, 10, 0.1705, 0.8090),
        (6, 7, 2, 7, 0.0582, 0.8062),
        (5, 56, 0, 29, -0.0381, 0.1926),
        (0, 10, 0, 20, -0.1611, 0.2775),
        (0, 10, 0, 10, -0.2775, 0.2775),
        (10, 10, 0, 20, 0.6791, 1.0),
        (10, 10, 0, 10, 0.6075, 1.0),
    ],
)
def test_newcombe_matches_the_published_intervals(
    k1: int, n1: int, k2: int, n2: int, low: float, high: float
) -> None:
    difference, got = newcombe_difference(k1, n1, k2, n2, Z95)
    assert difference == pytest.approx(k1 / n1 - k2 / n2, rel=1e-12, abs=1e-15)
    assert (round(got.low, 4), round(got.high, 4)) == (low, high)


@pytest.mark.parametrize(("k1", "n1", "k2", "n2"), [(1, 10, 9, 10), (30, 40, 5, 50), (0, 5, 5, 5)])
def test_newcombe_reads_each_proportion_at_its_own_z(k1: int, n1: int, k2: int, n2: int) -> None:
    # The second proportion's Wilson interval at z2, the first's at z: the low end widens
    # by the first's low side and the second's high side, the high end the other way.
    z, z2 = 1.0, 3.0
    a, b = wilson(k1, n1, z), wilson(k2, n2, z2)
    p1, p2 = k1 / n1, k2 / n2
    _, got = newcombe_difference(k1, n1, k2, n2, z, z2)
    low = p1 - p2 - math.sqrt((p1 - a.low) ** 2 + (b.high - p2) ** 2)
    high = p1 - p2 + math.sqrt((a.high - p1) ** 2 + (p2 - b.low) ** 2)
    assert got.low == pytest.approx(max(-1.0, low))
    assert got.high == pytest.approx(min(1.0, high))
    assert got != newcombe_difference(k1, n1, k2, n2, z)[1]
    assert newcombe_difference(k1, n1, k2, n2, z, z)[1] == newcombe_difference(k1, n1, k2, n2, z)[1]


def test_newcombe_at_minus_one_is_clamped_to_minus_one() -> None:
    assert newcombe_difference(0, 10, 10, 10, Z95) == (
        -1.0,
        Interval(-1.0, pytest.approx(-0.6075093504305243, rel=1e-12)),  # type: ignore[arg-type]
    )


ORDERED = [10.0 * i for i in range(1, 101)]  # values 10..1000: rank r is the value 10 r


@pytest.mark.parametrize(
    ("q", "z", "n", "low", "high"),
    [
        # ranks 50 -+ 9.8: 40 and 61 (the one-rank correction on the high side)
        (0.5, 1.96, 100, 400.0, 610.0),
        # 4x the samples: ranks 200 -+ 19.6 = 180 and 221 of 400, read at 45% and 55.25%
        (0.5, 1.96, 400, 450.0, 560.0),
        # a quarter of the samples: ranks 12.5 -+ 2.5 = 10 and 16 of 25, read at 40% and 64%
        (0.5, 1.0, 25, 400.0, 640.0),
        (0.5, 0.0, 100, 500.0, 510.0),
        (0.9, 1.0, 100, 870.0, 940.0),
        (0.95, 1.0, 100, 920.0, 990.0),
        # rank 100 of 100 is the last value; rank 101 is past it
        (0.95, 1.5, 100, 910.0, 1000.0),
        (0.95, 2.0, 100, 900.0, math.inf),
        (0.95, 3.0, 100, 880.0, math.inf),
        # rank 1 is the first value; rank -1 is below it
        (0.02, 0.5, 100, 10.0, 40.0),
        (0.01, 1.96, 100, -math.inf, 40.0),
    ],
)
def test_quantile_interval_reads_the_bounding_ranks(
    q: float, z: float, n: float, low: float, high: float
) -> None:
    assert quantile_interval(ORDERED, q, z, n) == Interval(low, high)


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        # one draw's worth: its minimum is bounded above by the largest value, its maximum
        # below by it; nothing else is bounded
        (0.0, Interval(-math.inf, 1000.0)),
        (1.0, Interval(1000.0, math.inf)),
        (0.5, Interval(-math.inf, math.inf)),
    ],
)
def test_quantile_interval_from_one_draw(q: float, expected: Interval) -> None:
    assert quantile_interval(ORDERED, q, 1.0, 1.0) == expected


@pytest.mark.parametrize(("ordered", "n"), [([], 10.0), ([1.0, 2.0], 0.0), ([5.0], -1.0)])
def test_quantile_interval_without_a_sample_is_unbounded(ordered: list[float], n: float) -> None:
    assert quantile_interval(ordered, 0.5, 1.0, n) == Interval(-math.inf, math.inf)


S2 = math.sqrt(2.0)


@pytest.mark.parametrize(
    ("top", "top_interval", "bottom", "bottom_interval", "expected"),
    [
        # log distances: top 2 down to 1 (log 2), up to 8 (log 4); bottom 1 down to 1/4
        # (log 4), up to 2 (log 2). Down: hypot(log 2, log 2); up: hypot(log 4, log 4).
        (
            2.0,
            Interval(1.0, 8.0),
            1.0,
            Interval(0.25, 2.0),
            Interval(2 * 2**-S2, 2 * 2 ** (2 * S2)),
        ),
        # the same with the roles swapped: the ratio is 1/2
        (
            1.0,
            Interval(0.25, 2.0),
            2.0,
            Interval(1.0, 8.0),
            Interval(0.5 * 2 ** (-2 * S2), 0.5 * 2**S2),
        ),
        # no spread at all: the ratio alone, exactly (a ratio on a threshold stays on it)
        (3.0, Interval(3.0, 3.0), 10.0, Interval(10.0, 10.0), Interval(0.3, 0.3)),
        # a top with no upper bound: no upper bound on the ratio
        (2.0, Interval(1.0, math.inf), 1.0, Interval(0.5, 2.0), Interval(2 * 2**-S2, math.inf)),
        # a bottom with no upper bound: the ratio may be as small as 0
        (2.0, Interval(1.0, 4.0), 1.0, Interval(0.5, math.inf), Interval(0.0, 2 * 2**S2)),
        # an unknown (NaN) upper end of the top: no upper bound, not a NaN no test can compare
        (2.0, Interval(1.0, math.nan), 1.0, Interval(0.5, 2.0), Interval(2 * 2**-S2, math.inf)),
    ],
)
def test_log_ratio_interval_combines_both_spreads(
    top: float, top_interval: Interval, bottom: float, bottom_interval: Interval, expected: Interval
) -> None:
    got = log_ratio_interval(top, top_interval, bottom, bottom_interval)
    assert got.low == pytest.approx(expected.low, rel=1e-12, abs=0.0)
    assert got.high == pytest.approx(expected.high, rel=1e-12, abs=0.0)


@pytest.mark.parametrize(
    ("top", "top_low", "bottom", "bottom_low"),
    [
        (0.0, 0.0, 1.0, 0.5),
        (1.0, 0.5, 0.0, 0.0),
        # a point at 0 under a positive low end (as a percentile may fall) is no ratio either
        (0.0, 0.5, 1.0, 0.5),
        (1.0, 0.5, 0.0, 0.5),
        (1.0, 0.0, 1.0, 0.5),
        (1.0, 0.5, 1.0, 0.0),
        (1.0, -0.5, 1.0, 0.5),
        (1.0, 0.5, 1.0, -1.0),
        (-1.0, -2.0, 1.0, 0.5),
    ],
)
def test_log_ratio_interval_without_a_positive_figure_is_unbounded(
    top: float, top_low: float, bottom: float, bottom_low: float
) -> None:
    got = log_ratio_interval(top, Interval(top_low, 2.0), bottom, Interval(bottom_low, 2.0))
    assert got == Interval(0.0, math.inf)
