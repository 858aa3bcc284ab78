"""Small inline SVG charts, generated in Python: no JavaScript library, no CDN, works offline.

Every plotted point carries `data-series`, `data-x` and `data-y` attributes and a `<title>`
tooltip, so a browser test (and a curious reader) can check what a chart holds."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvmigrate.html_text import escape

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2")
# One colour per backend role in every chart kvmigrate draws (report, bench): the hosted
# primary is blue, the self-hosted candidate orange.
PRIMARY_COLOR, CANDIDATE_COLOR = PALETTE[0], PALETTE[1]
HALF_CHAR = 3.5  # px: half a tick character; a centred label that would run off is right-aligned
WIDTH, HEIGHT = 640, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 52, 48
LEGEND_ITEM = 110  # px per legend entry, laid out in one row above the plot
TICKS = 5
LIMIT_SCALE = 4.0  # a target line more than this times the highest point is only named


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    color: str
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class Axis:
    label: str
    fmt: Callable[[float], str] = lambda v: f"{v:g}"
    ticks: Sequence[tuple[float, str]] | None = None  # fixed (value, label) ticks
    top: float | None = None  # a fixed upper bound (100 for percentages)


def nice_ceiling(value: float) -> float:
    if value <= 0 or not math.isfinite(value):
        return 1.0
    base = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * base:
            return float(step * base)
    return 10.0 * base


class _Frame:
    def __init__(self, x0: float, x1: float, y1: float) -> None:
        if x1 <= x0:
            x0, x1 = x0 - 1, x1 + 1
        self.x0, self.x1, self.y1 = x0, x1, y1

    def x(self, v: float) -> float:
        return float(LEFT + (v - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT))

    def y(self, v: float) -> float:
        return float(HEIGHT - BOTTOM - v / self.y1 * (HEIGHT - TOP - BOTTOM))


def el(tag: str, text: str | None = None, /, **attrs: object) -> str:
    """One SVG element; attribute names use `_` for `-` (`stroke_width` is stroke-width)."""
    rendered = "".join(
        f' {name.rstrip("_").replace("_", "-")}="{escape(_attr(value))}"'
        for name, value in attrs.items()
        if value is not None
    )
    return f"<{tag}{rendered}/>" if text is None else f"<{tag}{rendered}>{text}</{tag}>"


def _attr(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _open(key: str, title: str) -> list[str]:
    head = (
        f'<svg class="chart" data-chart="{escape(key)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}" '
        'xmlns="http://www.w3.org/2000/svg">'
    )
    return [head, el("text", escape(title), x=LEFT, y=20, class_="title")]


def _axes(frame: _Frame, x: Axis, y: Axis, x_ticks: Sequence[tuple[float, str]]) -> list[str]:
    out = []
    right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM
    for i in range(TICKS + 1):
        value = frame.y1 * i / TICKS
        py = frame.y(value)
        out.append(el("line", x1=LEFT, x2=right, y1=py, y2=py, class_="grid"))
        label = escape(y.fmt(value))
        out.append(el("text", label, x=LEFT - 6, y=py + 4, text_anchor="end", class_="tick"))
    for value, label in x_ticks:
        px = frame.x(value)
        tick = escape(label)
        anchor = "end" if px + HALF_CHAR * len(label) > WIDTH - 2 else "middle"
        out.append(el("text", tick, x=px, y=bottom + 16, text_anchor=anchor, class_="tick"))
    out.append(el("line", x1=LEFT, x2=right, y1=bottom, y2=bottom, class_="axis"))
    out.append(el("line", x1=LEFT, x2=LEFT, y1=TOP, y2=bottom, class_="axis"))
    middle = (LEFT + right) / 2
    xl = escape(x.label)
    out.append(el("text", xl, x=middle, y=HEIGHT - 10, text_anchor="middle", class_="label"))
    turn = f"translate(14 {(TOP + bottom) / 2}) rotate(-90)"
    out.append(el("text", escape(y.label), transform=turn, text_anchor="middle", class_="label"))
    return out


def _legend(series: Sequence[Series]) -> list[str]:
    out = []
    for i, s in enumerate(series):
        px, py = WIDTH - RIGHT - LEGEND_ITEM * (len(series) - i), TOP - 14
        dash = "5 3" if s.dashed else None
        out.append(
            el("line", x1=px, x2=px + 18, y1=py, y2=py, stroke=s.color, stroke_width=2,
               stroke_dasharray=dash)
        )  # fmt: skip
        out.append(el("text", escape(s.name), x=px + 24, y=py + 4, class_="legend"))
    return out


def _auto_ticks(frame: _Frame, axis: Axis) -> list[tuple[float, str]]:
    if axis.ticks is not None:
        return list(axis.ticks)
    span = frame.x1 - frame.x0
    values = (frame.x0 + span * i / TICKS for i in range(TICKS + 1))
    ticks: list[tuple[float, str]] = []
    for v in values:
        label = axis.fmt(v)
        if not ticks or ticks[-1][1] != label:  # a coarse format repeats: show each once
            ticks.append((v, label))
    return ticks


def line_chart(
    key: str,
    title: str,
    series: Sequence[Series],
    x: Axis,
    y: Axis,
    step: bool = False,
    limits: Sequence[tuple[float, str]] = (),
) -> str:
    """Lines through each series' points; `step` draws a staircase (a level held until the
    next point), for a rollout's percent over time. `limits`: horizontal target lines
    (value, label). One far above every point (over `LIMIT_SCALE` times the highest) would
    flatten the lines against the axis: it is named in a note instead of drawn."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return placeholder(key, title, "No data in this window.")
    xs = [px for s in drawn for px, _ in s.points]
    ys = [py for s in drawn for _, py in s.points]
    shown = [(v, label) for v, label in limits if v <= max(ys) * LIMIT_SCALE]
    noted = [(v, label) for v, label in limits if (v, label) not in shown]
    ys += [v for v, _ in shown]
    frame = _Frame(min(xs), max(xs), y.top or nice_ceiling(max(ys) * 1.05))
    out = _open(key, title) + _axes(frame, x, y, _auto_ticks(frame, x))
    out += _limits(frame, shown)
    for i, (value, label) in enumerate(noted):
        out.append(
            el("text", escape(f"{label}: far above every point"), x=WIDTH - RIGHT,
               y=20 + 14 * i, text_anchor="end", data_limit=f"{value:g}", class_="tick")
        )  # fmt: skip
    for s in drawn:
        dash = "5 3" if s.dashed else None
        points = _path(frame, s.points, step)
        out.append(
            el("polyline", fill="none", stroke=s.color, stroke_width=2, stroke_dasharray=dash,
               points=points, class_="line")
        )  # fmt: skip
        for px, py in s.points:
            tip = escape(f"{s.name}: {x.fmt(px)}, {y.fmt(py)}")
            out.append(
                el("circle", el("title", tip), cx=frame.x(px), cy=frame.y(py), r=3, fill=s.color,
                   data_series=s.name, data_x=f"{px:g}", data_y=f"{py:g}", class_="pt")
            )  # fmt: skip
    return "\n".join([*out, *_legend(drawn), "</svg>"])


def _limits(frame: _Frame, limits: Sequence[tuple[float, str]]) -> list[str]:
    out = []
    for value, label in limits:
        py = frame.y(value)
        out.append(
            el("line", x1=LEFT, x2=WIDTH - RIGHT, y1=py, y2=py, stroke="#e15759",
               stroke_dasharray="2 4", data_limit=f"{value:g}", class_="limit")
        )  # fmt: skip
        out.append(
            el("text", escape(label), x=WIDTH - RIGHT - 4, y=py - 4, text_anchor="end",
               class_="tick")
        )  # fmt: skip
    return out


def _path(frame: _Frame, points: Sequence[tuple[float, float]], step: bool) -> str:
    coords: list[tuple[float, float]] = []
    for i, (px, py) in enumerate(points):
        if step and i:
            coords.append((px, points[i - 1][1]))
        coords.append((px, py))
    return " ".join(f"{frame.x(px):.1f},{frame.y(py):.1f}" for px, py in coords)


def bar_chart(
    key: str,
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    y: Axis,
    x_label: str,
    color: str = PALETTE[0],
) -> str:
    if not values or max(values) <= 0:
        return placeholder(key, title, "No data in this window.")
    frame = _Frame(0, len(values), nice_ceiling(max(values) * 1.05))
    ticks = [(i + 0.5, label) for i, label in enumerate(labels)]
    out = _open(key, title) + _axes(frame, Axis(x_label), y, ticks)
    slot = frame.x(1) - frame.x(0)
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        top = frame.y(value)
        tip = el("title", escape(f"{label}: {value:g}"))
        out.append(
            el("rect", tip, x=frame.x(i) + slot * 0.1, y=top, width=slot * 0.8,
               height=HEIGHT - BOTTOM - top, fill=color, data_series=title, data_x=label,
               data_y=f"{value:g}", class_="bar")
        )  # fmt: skip
    return "\n".join([*out, "</svg>"])


def placeholder(key: str, title: str, message: str) -> str:
    box = el(
        "rect", x=LEFT, y=TOP, width=WIDTH - LEFT - RIGHT, height=HEIGHT - TOP - BOTTOM,
        class_="empty",
    )  # fmt: skip
    text = el(
        "text", escape(message), x=WIDTH / 2, y=HEIGHT / 2, text_anchor="middle",
        class_="placeholder",
    )  # fmt: skip
    return "\n".join([*_open(key, title), box, text, "</svg>"])
