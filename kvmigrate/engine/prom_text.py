"""The few series a scrape needs, read out of Prometheus's text format.

Only the lines of the metrics asked for are parsed: a vLLM /metrics answer has hundreds of
lines (python_gc_*, http_*, every histogram's buckets) of which a scrape reads a few
dozen, and a full parse (prometheus_client.parser) builds an object for every one of them.
A line that cannot be read is counted, never raised: an exporter's odd line must not lose
the others.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field

# `name{label="value",...} value [timestamp]`; a label value may hold escaped quotes.
_LINE = re.compile(
    r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>(?:[^\"}]|\"(?:[^\"\\]|\\.)*\")*)\})?"
    r"\s+(?P<value>\S+)(?:\s+-?\d+)?\s*"
)
_LABEL = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"((?:[^\"\\]|\\.)*)\"\s*,?")


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class Parsed:
    """The series kept, and how many of their lines could not be read."""

    series: list[Series] = field(default_factory=list)
    bad_lines: int = 0

    def named(self, name: str) -> list[Series]:
        return [s for s in self.series if s.name == name]

    def names(self) -> set[str]:
        return {s.name for s in self.series}


def parse(text: str, prefixes: Collection[str]) -> Parsed:
    """Every series whose name starts with one of `prefixes` (whole metric names, or a
    histogram's name, whose `_bucket`, `_sum` and `_count` lines come with it)."""
    starts = tuple(prefixes)
    parsed = Parsed()
    for line in text.splitlines():
        if not line.startswith(starts):
            continue
        series = _series(line)
        if series is None:
            parsed.bad_lines += 1
        else:
            parsed.series.append(series)
    return parsed


def _series(line: str) -> Series | None:
    match = _LINE.fullmatch(line)
    if match is None:
        return None
    try:
        value = float(match["value"])
    except ValueError:
        return None
    if math.isnan(value):
        return None
    labels: dict[str, str] = {}
    text = match["labels"] or ""
    at = 0
    while at < len(text):
        label = _LABEL.match(text, at)
        if label is None or label.end() == at:
            return None
        labels[label[1]] = _unescape(label[2])
        at = label.end()
    return Series(match["name"], labels, value)


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return value.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
