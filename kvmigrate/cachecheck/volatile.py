"""Values that change on every turn by construction: timestamps, ids, counters.

A break is blamed on such a value when the first difference between the old and the new text
falls inside a match of the same pattern in both. Ids are tried before dates and counters
because a uuid or a hex id is full of digits that would also pass for a number.
"""

from __future__ import annotations

import re

from kvmigrate.cachecheck.classes import BreakClass

_MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|"
    r"December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\b\.?"
)
_WEEKDAY = r"(?:Mon|Tues|Tue|Wednes|Wed|Thurs|Thur|Thu|Fri|Satur|Sat|Sun)(?:day)?\b\.?"
_TIME = (
    r"\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:\s?[AaPp]\.?[Mm]\.?)?"
    r"(?:\s?(?:Z|UTC|GMT|[A-Z]{3,4}|[+-]\d{2}:?\d{2}))?"
)

TIMESTAMP_PATTERNS = (
    # ISO 8601 and its common relatives: 2025-01-06, 2025-01-06T10:31:07.123Z, 2025/01/06 10:31
    re.compile(rf"\d{{4}}[-/.]\d{{1,2}}[-/.]\d{{1,2}}(?:[T ]{_TIME})?"),
    re.compile(rf"\d{{1,2}}(?:[-/]\d{{1,2}}[-/]\d{{2,4}}|\.\d{{1,2}}\.\d{{4}})(?:,?\s{_TIME})?"),
    # Monday, January 6, 2025 10:31 / 6 Jan 2025 / Jan 6th
    re.compile(
        rf"(?:{_WEEKDAY},?\s+)?(?:{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?|\d{{1,2}}\s+{_MONTH})"
        rf"(?:,?\s+\d{{4}})?(?:,?\s+(?:at\s+)?{_TIME})?"
    ),
    re.compile(rf"{_WEEKDAY}(?:,?\s+{_TIME})?"),
    re.compile(_TIME),
    # Unix epoch seconds or milliseconds from 2001 to 2033.
    re.compile(r"(?<!\d)1[0-9]\d{8}(?:\d{3})?(?:\.\d+)?(?!\d)"),
)

ID_PATTERNS = (
    re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
    # Prefixed ids: req_abc123, chatcmpl-..., trace-id, run_..., msg_...
    re.compile(
        r"\b(?:req|request|trace|span|corr|correlation|msg|run|sess|session|chatcmpl|call|"
        r"evt|job|txn|id)[-_:=]?(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9][A-Za-z0-9_-]{5,}"
    ),
    # Bare hex or base62 ids: 12+ hex digits, or 16+ letters and digits mixed.
    re.compile(
        r"(?<![A-Za-z0-9])(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}(?![A-Za-z0-9])"
    ),
    re.compile(r"(?<![A-Za-z0-9])(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{16,}"),
)

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
