"""Several percentiles from one sort give what one percentile at a time gives: linear
interpolation between closest ranks (numpy's default), worked out by hand below."""

from __future__ import annotations

import math

import pytest

from kvmigrate.percentile import percentile, percentiles


@pytest.mark.parametrize(
    ("values", "qs", "expected"),
    [
        ([4.0, 1.0, 3.0, 2.0], (50, 95), [2.5, 3.85]),  # ranks 1.5 and 2.85 of 1..4
        ([7.0], (0, 50, 100), [7.0, 7.0, 7.0]),
        ([1.0, math.inf, 3.0, math.nan], (50,), [2.0]),  # not finite: left out
        ([], (50, 95), [None, None]),
        ([math.inf], (95,), [None]),
    ],
)
def test_percentiles(values: list[float], qs: tuple[float, ...], expected: list[float]) -> None:
    assert percentiles(values, qs) == pytest.approx(expected)
    assert [percentile(values, q) for q in qs] == pytest.approx(expected)
