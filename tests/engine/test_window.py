"""Counters and histograms over a window, as Prometheus's increase() and
histogram_quantile() read them: tables."""

from __future__ import annotations

import math

import pytest

from kvmigrate.engine.vllm_sample import Histogram
from kvmigrate.engine.window import histogram_increase, increase, merge, quantile

INF = math.inf


@pytest.mark.parametrize(
    ("values", "grown"),
    [
        ([], None),
        ([5.0], None),  # one sample cannot tell growth
        ([5.0, 5.0], 0.0),
        ([5.0, 8.0, 12.0], 7.0),
        ([5.0, None, 12.0], 7.0),  # a scrape without the figure is skipped
        ([100.0, 120.0, 10.0, 15.0], 35.0),  # a restart: 20, then 10 from zero, then 5
        ([3.0, math.nan, 4.0], 1.0),
    ],
)
def test_increase(values: list[float | None], grown: float | None) -> None:
    assert increase(values) == grown


def h(*buckets: tuple[float, float], total: float = 0.0) -> Histogram:
    return Histogram(tuple(buckets), total, buckets[-1][1])


def test_histogram_increase_is_bucket_by_bucket_and_survives_a_restart() -> None:
    first = h((0.1, 2), (0.5, 3), (INF, 3), total=0.4)
    later = h((0.1, 5), (0.5, 9), (INF, 10), total=2.4)
    restarted = h((0.1, 1), (0.5, 1), (INF, 1), total=0.05)
    grown = histogram_increase([first, later, restarted])
    assert grown is not None
    assert grown.buckets == ((0.1, 4.0), (0.5, 7.0), (INF, 8.0))
    assert grown.count == 8.0
    assert grown.sum == pytest.approx(2.05)
    assert histogram_increase([first]) is None
    assert histogram_increase([first, None]) is None


@pytest.mark.parametrize(
    ("q", "value"),
    [
        (0.5, 0.18),  # rank 5 of 10: the first of the 5 in (0.1, 0.5], a fifth of the way
        (0.4, 0.1),
        (0.2, 0.05),
        (0.95, 0.5),  # in +Inf's bucket: the highest finite bound
    ],
)
def test_quantile_interpolates_within_its_bucket(q: float, value: float) -> None:
    histogram = h((0.1, 4), (0.5, 9), (INF, 10))
    assert quantile(histogram, q) == pytest.approx(value)


def test_quantile_of_nothing_is_none() -> None:
    assert quantile(None, 0.5) is None
    assert quantile(h((0.1, 0), (INF, 0)), 0.5) is None


def test_merge_adds_engines_bucket_by_bucket() -> None:
    merged = merge([h((0.1, 1), (INF, 2), total=1.0), h((0.1, 3), (INF, 3), total=0.5)])
    assert merged == Histogram(((0.1, 4.0), (INF, 5.0)), 1.5, 5.0)
    assert merge([]) is None
