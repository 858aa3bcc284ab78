"""Short, redacted before/after windows around a break, safe to print and to record.

Digits become `#`, emails and keys become placeholders: the shape of the change stays
visible (`Current time: ####-##-## ##:##`) while the data does not.
"""

from __future__ import annotations

import re

from kvmigrate.named_secrets import SECRET, may_name_a_secret, redact_assignments, value_spans

WINDOW = 32
# How far around a window its line is read for the name of a secret the window cuts into.
_REACH = 4096

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
    # A value known only by its name first (`session_token: "a b"`): a rotating token in a
    # system prompt is the very change a window is cut around.
    if may_name_a_secret(text):
        text = redact_assignments(text)
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
    piece = redact(_named_values_hidden(text, start, end))
    piece = piece.replace("\r", "").replace("\n", "⏎").replace("\t", "→")
    return ("…" if start > 0 else "") + piece + ("…" if end < len(text) else "")


def _named_values_hidden(text: str, start: int, end: int) -> str:
    """`text[start:end]` with the values of named secrets hidden, those whose name is before
    the window included: a window can start inside `password: "correct horse battery"`."""
    reach_from = max(0, start - _REACH)
    newline = text.rfind("\n", reach_from, start)
    line_start = newline + 1 if newline >= 0 else reach_from
    region = text[line_start : min(len(text), end + _REACH)]
    if not may_name_a_secret(region):
        return text[start:end]
    pieces: list[str] = []
    at = start
    for value_start, value_end in value_spans(region):
        lo, hi = max(at, line_start + value_start), min(end, line_start + value_end)
        if lo < hi:
            pieces += (text[at:lo], SECRET)
            at = hi
        if line_start + value_start >= end:
            break
    pieces.append(text[at:end])
    return "".join(pieces)
