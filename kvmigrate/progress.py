"""Progress for long CLI runs: a bar on a terminal, one summary line anywhere else.

`click.progressbar` off a terminal prints its bare label (`conversations`, `requests`) and
nothing else, which reads like a stray word in CI logs and piped output.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, Protocol, TextIO

import click


class Progress(Protocol):
    def update(self, n_steps: int) -> None: ...


class _Count:
    def __init__(self) -> None:
        self.done = 0

    def update(self, n_steps: int) -> None:
        self.done += n_steps


@contextlib.contextmanager
def progress(
    length: int, label: str, file: TextIO | None = None, **options: Any
) -> Iterator[Progress]:
    """`click.progressbar(length=..., label=...)` on a terminal; elsewhere it counts and
    writes `label: done/length` once, at the end."""
    out = file or sys.stderr
    if out.isatty():
        with click.progressbar(length=length, label=label, file=out, **options) as bar:
            yield bar
        return
    count = _Count()
    try:
        yield count
    finally:
        click.echo(f"{label.strip()}: {count.done}/{length}", file=out)
