"""Request values made safe to log: one line, no control characters, bounded length.

A client controls its path, headers and body. Logged raw, a `%0D%0A` in a path writes a
forged log line, and an escape sequence can rewrite what a terminal shows.
"""

from __future__ import annotations

LIMIT = 300
# A value a client gave, quoted in an error: a 2 MB cohort name came back whole in the 409.
QUOTED_LIMIT = 256


def printable(value: object, limit: int = LIMIT, keep: str = "") -> str:
    """`value` as text with every non-printable character escaped (`\\r`, `\\x1b`, lone
    surrogates from bytes that were not UTF-8) but those in `keep`, cut to `limit`
    characters."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() or c in keep else _escape(c) for c in text)
    return text if len(text) <= limit else text[:limit] + "..."


def _escape(char: str) -> str:
    return char.encode("unicode_escape", "backslashreplace").decode("ascii")


def printable_lines(value: object, limit: int = 10_000) -> str:
    """`value` for a terminal, line by line as `printable` makes each (a stored cohort
    name, reason or actor may hold an escape sequence or a bidi control that reorders what
    the operator reads), its line breaks kept."""
    return "\n".join(printable(line, limit) for line in str(value).split("\n"))


def quoted(value: object, limit: int = QUOTED_LIMIT) -> str:
    """`value` quoted in a message, as `!r` would, but printable and cut to `limit`: a
    client's value must not come back unbounded, nor reach a terminal or a log raw."""
    return "'" + printable(value, limit) + "'"
