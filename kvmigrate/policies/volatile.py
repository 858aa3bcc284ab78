"""Values that change on every turn by construction: timestamps, dates, ids.

Two parts read them: the cache-buster detector (which blames a prefix break on such a value)
and conversation identity (which masks them in a conversation's opening before hashing it,
so `Current time: ...` in a system prompt does not make every turn a new conversation).
They live here, in pure policy code, so both share one set of patterns without an import
cycle. Bare numbers (counters) are left to the detector: masking every number would make
"What is 2+2" and "What is 3+3" one opening.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

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

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# Prefixed ids: req_abc123, chatcmpl-..., trace-id, run_..., msg_... (an id holds a digit)
_ID_PREFIX = (
    r"\b(?:req|request|trace|span|corr|correlation|msg|run|sess|session|chatcmpl|call|"
    r"evt|job|txn|id)[-_:=]?"
)
_ID_RUN = r"[A-Za-z0-9][A-Za-z0-9_-]{5,}"
ID_PATTERNS = (
    re.compile(_UUID),
    re.compile(_ID_PREFIX + r"(?=[A-Za-z0-9_-]*\d)" + _ID_RUN),
    # Bare hex or base62 ids: 12+ hex digits, or 16+ letters and digits mixed.
    re.compile(
        r"(?<![A-Za-z0-9])(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}(?![A-Za-z0-9])"
    ),
    re.compile(r"(?<![A-Za-z0-9])(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{16,}"),
)

# Ids first: a uuid or a hex id is full of digits that would also pass for a date or a time.
# Masking takes the prefixed id's run whole, digit or not, and keeps a run without one as it
# is (`_masked`): ID_PATTERNS' lookahead for that digit rescans the rest of the run from
# every prefix inside it, so "id-id-id-..." cost time in the square of its length (a few
# KB of it held the loop for seconds). Whole runs make one pass; what changes is only that a weekday
# inside a digitless run (`id-Monday-x`) is no longer masked on its own.
VOLATILE_PATTERN = re.compile(
    "|".join(
        f"(?:{p})"
        for p in (
            _UUID,
            f"(?P<prefixed>{_ID_PREFIX}{_ID_RUN})",
            *(p.pattern for p in ID_PATTERNS[2:]),
            *(p.pattern for p in TIMESTAMP_PATTERNS),
        )
    )
)
MASK = "\x00"
_DIGIT = re.compile(r"\d")


def mask_all(text: str) -> str:
    """`text` with every volatile span masked, all of it searched (`mask_volatile` searches
    only the lines that can hold one)."""
    return VOLATILE_PATTERN.sub(_masked, text)


def _masked(match: re.Match[str]) -> str:
    if match.group("prefixed") is not None and _DIGIT.search(match.group()) is None:
        return match.group()
    return MASK


# Searching costs time in proportion to the text, on the proxy's loop, and an agent resends
# its opening every turn (benchmarks/opening_mask.py measures a large system prompt's cost
# a turn). So an opening met again is
# masked from a cache: whole (a pasted document, a prompt without a timestamp), else line
# by line (a prompt whose timestamp line changes every turn). The caches memoise a pure
# function, so they change no result; their bounds keep them under 16 MB of ASCII text
# (under 64 MB of text in 4-byte characters).
TEXT_CACHE_SIZE = 16
CACHED_TEXT_CHARS = 256 * 1024
LINE_CACHE_SIZE = 1024
CACHED_LINE_CHARS = 4096
# The most characters searched in one text, so that no request can hold the loop for long
# (the cost grows with the characters searched: benchmarks/opening_mask.py measures it at
# this bound). Lines past it are left as
# they are: an opening that long with values changing past it splits its conversation.
SEARCH_BUDGET = 128 * 1024


def mask_volatile(text: str) -> str:
    """`text` with every timestamp, date and id replaced by one placeholder.

    Every pattern but a bare weekday needs a digit, so only the lines holding one are
    searched: a long system prompt usually carries its timestamp on one short line, and
    scanning all of it with ten patterns costs milliseconds. (A bare weekday on a line
    without digits is therefore left as it is, and no value spans two lines.)"""
    if len(text) <= CACHED_TEXT_CHARS:
        return _mask_cached_text(text)
    return _mask_lines(text)


@functools.lru_cache(maxsize=TEXT_CACHE_SIZE)
def _mask_cached_text(text: str) -> str:
    return _mask_lines(text)


def _mask_lines(text: str) -> str:
    pieces = []
    done = 0
    budget = SEARCH_BUDGET
    for start, end in _digit_lines(text):
        if budget <= 0:
            break
        cut = min(end, start + budget)
        budget -= cut - start
        line = text[start:cut]
        masked = _mask_cached_line(line) if len(line) <= CACHED_LINE_CHARS else mask_all(line)
        pieces += [text[done:start], masked]
        done = cut
    pieces.append(text[done:])
    return "".join(pieces)


@functools.lru_cache(maxsize=LINE_CACHE_SIZE)
def _mask_cached_line(line: str) -> str:
    return mask_all(line)


# ASCII digits -> b"d", newlines kept, everything else -> b" ": one C pass finds the lines
# worth a regex.
_DIGIT_MARKS = bytes(
    ord("d") if chr(i).isdigit() else ord("\n") if i == 10 else ord(" ") for i in range(256)
)


def _digit_lines(text: str) -> Iterator[tuple[int, int]]:
    """The start and end of each line that holds a digit: any digit, as `\\d` matches
    them all, found in one C pass for ASCII text."""
    if text.isascii():
        marks = text.encode("ascii").translate(_DIGIT_MARKS)

        def next_digit(at: int) -> int:
            return marks.find(b"d", at)
    else:

        def next_digit(at: int) -> int:
            found = _DIGIT.search(text, at)
            return found.start() if found is not None else -1

    at = next_digit(0)
    while at >= 0:
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        end = len(text) if end < 0 else end
        yield start, end
        at = next_digit(end)
