"""Short, redacted before/after windows around a break, safe to print and to record.

Digits become `#`, emails and keys become placeholders: the shape of the change stays
visible (`Current time: ####-##-## ##:##`) while the data does not.
"""

from __future__ import annotations

import re

WINDOW = 32

_REDACTIONS = (
    (re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"), "[email]"),
    (re.compile(r"\b(?:sk|rk|pk)[-_][A-Za-z0-9_-]{8,}"), "[key]"),
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"), "Bearer [key]"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "[key]"),
    (
        re.compile(r"\b(?:ghp|gho|ghs|ghu|github_pat|xox[abprs]|glpat)[-_][A-Za-z0-9_-]{10,}"),
        "[key]",
    ),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), "[key]"),
    (re.compile(r"\d"), "#"),
)


def redact(text: str) -> str:
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


def window(text: str, offset: int, width: int = WINDOW) -> str:
    """`width` characters either side of `offset`, redacted, with `…` where it was cut and
    newlines shown as `⏎` so the excerpt fits a table cell."""
    start, end = max(0, offset - width), min(len(text), offset + width)
    # Never cut a word: a key cut in half would no longer be recognised as one.
    floor, ceiling = max(0, start - 48), min(len(text), end + 48)
    while start > floor and not text[start - 1].isspace():
        start -= 1
    while end < ceiling and not text[end].isspace():
        end += 1
    piece = redact(text[start:end])
    piece = piece.replace("\r", "").replace("\n", "⏎").replace("\t", "→")
    return ("…" if start > 0 else "") + piece + ("…" if end < len(text) else "")
