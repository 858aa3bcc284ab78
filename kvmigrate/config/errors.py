"""The one error type that config loading raises, and how it quotes a value."""

from __future__ import annotations

import reprlib

from kvmigrate.logtext import printable

# What an error may quote of one value, and of itself: a file can hold a value of any size
# (a key of a megabyte, a list of a hundred thousand items), and an error is read on a
# terminal and in a deploy log.
VALUE_CHARS = 80
PATH_CHARS = 300
REASON_CHARS = 2000


class ConfigError(Exception):
    """A config file that cannot be used, with where and why.

    The message names the file, the dotted key path and the reason, so the CLI can print it
    as it is and exit non-zero instead of showing a traceback. Path and reason are cut to a
    readable length whatever a caller put in them.
    """

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = printable(path, PATH_CHARS)
        self.reason = reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS] + "..."
        where = f"{source}: {self.path}" if self.path else source
        super().__init__(f"{where}: {self.reason}")


def shown(value: object) -> str:
    """`repr(value)` cut to a few items and characters at every level, computed as it is cut
    (a full repr of a large value is itself the cost to avoid)."""
    cut = reprlib.Repr()
    cut.maxstring = cut.maxother = VALUE_CHARS
    cut.maxlist = cut.maxtuple = cut.maxdict = cut.maxset = 6
    cut.maxlevel = 3
    return cut.repr(value)
