"""The HTML report's chart of GPU utilisation and KV-cache use over the window, with the
playbook's 70-80% utilisation band drawn as its two bounds."""

from __future__ import annotations

import time

from kvmigrate.render.svg import (
    CANDIDATE_COLOR,
    PALETTE,
    PRIMARY_COLOR,
    Axis,
    Series,
    line_chart,
)
from kvmigrate.report.model import Report

KEY = "gpu-use"
TITLE = "GPU utilisation and KV cache in use"
BAND_COLOR = "#9c9c9c"


def gpu_charts(report: Report) -> list[str]:
    """The chart, when the window holds scrapes (the GPU table says why it has none)."""
    gpu = report.gpu
    if gpu is None or not gpu.series:
        return []
    start = min(p[0] for s in gpu.series for p in s.points)
    end = max(p[0] for s in gpu.series for p in s.points)
    colors = iter(PALETTE[2:])
    series = [
        Series(
            s.name,
            [(ts - start, value) for ts, value in s.points],
            PRIMARY_COLOR if s.name == "GPU utilisation" else next(colors, CANDIDATE_COLOR),
        )
        for s in gpu.series
    ]
    span = max(end - start, 1.0)
    for bound in (gpu.band_low_pct, gpu.band_high_pct):
        series.append(Series(f"target {bound:g}%", [(0.0, bound), (span, bound)], BAND_COLOR, True))
    shape = "%H:%M:%S" if span < 600 else "%m-%d %H:%M"
    x = Axis("time (UTC)", lambda v: time.strftime(shape, time.gmtime(start + v)))
    y = Axis("in use (%)", lambda v: f"{v:.0f}%", top=100.0)
    return [line_chart(KEY, TITLE, series, x, y)]
