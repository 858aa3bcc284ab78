"""A target line on a chart (the playbook's 3 s): drawn where the data comes near it, named
in a note where drawing it would flatten every line against the axis."""

from __future__ import annotations

import re

import pytest

from kvmigrate.render.svg import Axis, Series, line_chart


@pytest.mark.parametrize(
    ("highest", "drawn"),
    [(2600.0, True), (750.0, True), (749.0, False), (60.0, False)],  # 3000 / 4 = 750
)
def test_a_limit_is_drawn_or_named(highest: float, drawn: bool) -> None:
    series = [Series("vllm p95", [(1.0, 40.0), (2.0, highest)], "#000")]
    svg = line_chart("ttft", "TTFT", series, Axis("turn"), Axis("ms"), limits=[(3000.0, "3 s")])
    lines = re.findall(r'<line [^>]*class="limit"/>', svg)
    notes = re.findall(r'<text [^>]*data-limit="3000"[^>]*>([^<]*)</text>', svg)
    if drawn:
        [line] = lines
        assert 'data-limit="3000"' in line
        assert notes == []
        # Inside the plot: the axis reaches at least the limit.
        y = float(re.search(r'y1="([\d.]+)"', line).group(1))  # type: ignore[union-attr]
        assert 52 <= y <= 320 - 48
    else:
        assert lines == []
        assert notes == ["3 s: far above every point"]
