"""Secrets known by their name, not their shape: `password: hunter2`, `"api_key": "..."`,
and the members of a JSON object whose key names a secret.

A short password has no shape of its own; only the name next to it gives it away. So the
whole value goes, however it is written: quoted with spaces in it, JSON-escaped inside a
JSON string, in backticks, or bare to the end of its token. The name stays, so a reader
still sees what was there.

Linear in the text: the names are found by one regex with no nested repetition, and each
value is scanned once, from its name forward, by hand (a regex for "up to the matching
quote" backtracks on a value that never closes).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

SECRET = "[SECRET]"

# The last part of a name that holds a secret: `password`, `DB_PASSWORD`, `apiKey`,
# `client_secret`, `x-api-key`, `refresh_token`. The word must end the name: `passage`,
# `keyboard`, `secretary` and `max_tokens` (a count of tokens) are not secrets. A bare
# `key` is too common a name (`sort_key`, `cache_key`) to count without a telling prefix.
_NAME = (
    r"(?:pass(?:word|wd|phrase)|secret|credential)s?|pwd|token|auth(?:orization)?|cookie"
    r"|(?<=[_-])pass"
    r"|(?:api|access|secret|private|client|signing|encryption|master|admin|session"
    r"|subscription|account|service|auth)[_-]?keys?"
)
# Where a name's last part starts: after anything but a letter or digit (`_` and `-`
# included), or at a camelCase hump (`accessToken`).
_EDGE = r"(?:(?<![^\W_])|(?<=[a-z0-9])(?=[A-Z]))"
# A name, its closing quote if any (JSON-escaped too: `\"password\": \"...\"`), then the
# operator: longest first, or `=` would read `pwd => hunter2` as the value `>`.
_ASSIGNMENT = re.compile(_EDGE + r"(?i:" + _NAME + r")(?:\\*[\"'`])?\s*(?::=|=>|=|:)\s*")
_KEY = re.compile(_EDGE + r"(?i:" + _NAME + r")\Z")
_QUOTES = "\"'`"
# Punctuation that ends a sentence or a JSON value rather than belonging to a bare value
# (not `!` or `?`: passwords end with them as often as sentences do).
_TRAILING = ",;.:)]}>\"'`"
# A bare value that is an authorization scheme has its credentials in the next token.
_SCHEMES = frozenset({"basic", "bearer", "digest", "token", "negotiate", "apikey"})
_TOKEN = re.compile(r"\S+")
_GAP = re.compile(r"[ \t]+")


def is_secret_name(name: str) -> bool:
    """Whether a JSON member or a parameter named `name` holds a secret."""
    return _KEY.search(name) is not None


def may_name_a_secret(text: str) -> bool:
    """A cheap superset test: False means `redact_assignments` would change nothing."""
    # Bytes searches at memory speed, one per word any name above holds; spelled out, as a
    # loop over the words cost more than the searches on the short strings of a history.
    b = text.lower().encode("utf-8", "surrogateescape")
    return (
        b"pass" in b or b"pwd" in b or b"secret" in b or b"key" in b or b"token" in b
        or b"auth" in b or b"cookie" in b or b"credential" in b
    )  # fmt: skip


def redact_assignments(text: str) -> str:
    """`text` with the value after each secret's name replaced by `SECRET`."""
    pieces: list[str] = []
    done = 0
    for value_start, value_end in value_spans(text):
        pieces += (text[done:value_start], SECRET)
        done = value_end
    if not pieces:
        return text
    pieces.append(text[done:])
    return "".join(pieces)


def value_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each value after a secret's name, in order, none empty."""
    pos = 0
    newline = -1  # the next line end at or after `pos`, found once per line
    while (match := _ASSIGNMENT.search(text, pos)) is not None:
        start = match.end()
        if newline < start:
            newline = text.find("\n", start)
            if newline < 0:
                newline = len(text)
        quoted = _quoted(text, start, newline)
        if quoted is not None:
            value_start, value_end, pos = quoted
        else:
            value_start, (value_end, pos) = start, _bare(text, start)
        if value_end > value_start:
            yield value_start, value_end
        pos = max(pos, match.end())


def _quoted(text: str, start: int, newline: int) -> tuple[int, int, int] | None:
    """(value start, value end, where to go on) for a value opening with a quote, maybe
    escaped (`\\"` inside a JSON string, `\\\\\\"` a level deeper); None for a bare one.

    The value ends at the same quote escaped the same way: at that level a quote escaped
    once more is part of the value. Unclosed on its line, the value is the rest of it."""
    i = start
    while i < newline and text[i] == "\\":
        i += 1
    if i >= newline or text[i] not in _QUOTES:
        return None
    escapes, quote, value_start = i - start, text[i], i + 1
    # A quote `escapes` backslashes deep closes the value; one escaped again at that level
    # (`escapes + 1` more backslashes, each doubled once per level) belongs to it.
    period = 2 * (escapes + 1)
    j = value_start
    while (k := text.find(quote, j, newline)) >= 0:
        run = 0
        while k - run > value_start and text[k - 1 - run] == "\\":
            run += 1
        if run >= escapes and (run - escapes) % period == 0:
            return value_start, k - escapes, k + 1
        j = k + 1
    return value_start, newline, newline


def _bare(text: str, start: int) -> tuple[int, int]:
    """(value end, where to go on) for an unquoted value: to the end of its token, less
    the punctuation that closes a sentence or a JSON value; an authorization scheme's
    credentials (`Basic dXNlcjpw`) are the next token, and go too."""
    token = _TOKEN.match(text, start)
    if token is None:
        return start, start
    end = token.end()
    if token.group().lower() in _SCHEMES and (gap := _GAP.match(text, end)) is not None:
        following = _TOKEN.match(text, gap.end())
        if following is not None:
            end = following.end()
    cut = end
    while cut > start and text[cut - 1] in _TRAILING:
        cut -= 1
    return (cut if cut > start else end), end
