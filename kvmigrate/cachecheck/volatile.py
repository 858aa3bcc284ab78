"""Values that change on every turn by construction: timestamps, ids, counters.

A break is blamed on such a value when the first difference between the old and the new text
falls inside a match of the same pattern in both. Ids are tried before dates and counters
because a uuid or a hex id is full of digits that would also pass for a number.
"""

from __future__ import annotations

import re

from kvmigrate.cachecheck.classes import BreakClass
from kvmigrate.policies.volatile import ID_PATTERNS, TIMESTAMP_PATTERNS

COUNTER_PATTERN = re.compile(r"(?<![\w.])\d+(?![\w.]*\d)")

# What introduces a value: the words before it on its line, e.g. "Current time:".
_LABEL = re.compile(r"([A-Za-z][\w ()/-]{0,40}[:=#]?)\s*$")


def volatile_class(old: str, new: str, offset: int) -> tuple[BreakClass, str] | None:
    """The class of the changing value at `offset` (where old and new first differ) and the
    label that introduces it in `new`; None when no volatile value covers that offset."""
    for cls, patterns in (
        (BreakClass.REQUEST_ID, ID_PATTERNS),
        (BreakClass.TIMESTAMP, TIMESTAMP_PATTERNS),
        (BreakClass.COUNTER, (COUNTER_PATTERN,)),
    ):
        for pattern in patterns:
            a, b = _covering(pattern, old, offset), _covering(pattern, new, offset)
            if a is not None and b is not None:
                return cls, label_before(new, b.start())
    return None


def _covering(pattern: re.Pattern[str], text: str, offset: int) -> re.Match[str] | None:
    """The match that holds `offset` or ends right there (`12` -> `123` first differs just
    after the old number). Only a window around the offset is searched: texts can be long."""
    for match in pattern.finditer(text, max(0, offset - 64), offset + 64):
        if match.start() <= offset <= match.end() and match.end() > match.start():
            return match
    return None


def label_before(text: str, position: int) -> str:
    line_start = text.rfind("\n", 0, position) + 1
    match = _LABEL.search(text[max(line_start, position - 48) : position])
    return match.group(1).strip() if match else ""
