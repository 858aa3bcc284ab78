"""Bytes to text and back without losing a BOM or a line ending, and splicing edits into text.

Every rewriter edits the original text at recorded offsets rather than re-serialising a
parsed tree, so bytes outside the edited values cannot change.
"""

from __future__ import annotations

import bisect
import codecs
from collections.abc import Iterable
from dataclasses import dataclass

from kvmigrate.migrate.findings import Edit


class NotUtf8(ValueError):
    """The file is not UTF-8 (latin-1, UTF-16, ...); we report it rather than guess."""


@dataclass(frozen=True, slots=True)
class Decoded:
    text: str
    bom: bool  # a UTF-8 byte order mark, restored on encode

    def encode(self, text: str) -> bytes:
        body = text.encode("utf-8")
        return codecs.BOM_UTF8 + body if self.bom else body


def decode(raw: bytes) -> Decoded:
    # bytes.decode never translates newlines, so CRLF and lone CR survive the round trip.
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_LE)):
        raise NotUtf8("UTF-16/32 text is not rewritten")
    bom = raw.startswith(codecs.BOM_UTF8)
    try:
        text = raw[len(codecs.BOM_UTF8) :].decode("utf-8") if bom else raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    return Decoded(text, bom)


class OverlappingEdits(ValueError):
    """Two rewrites want different text in one place: a YAML anchor shared by variables that
    need different values (OPENAI_BASE_URL ends in /v1, ANTHROPIC_BASE_URL does not)."""


def splice(text: str, edits: Iterable[Edit]) -> str:
    """Apply non-overlapping edits; identical duplicates (a YAML alias) collapse into one."""
    ordered = sorted(set(edits), key=lambda e: (e.start, e.end))
    out: list[str] = []
    pos = 0
    for edit in ordered:
        if edit.start < pos:
            line = LineIndex(text).line(edit.start)
            raise OverlappingEdits(
                f"line {line}: one value is shared (a YAML anchor and alias) by settings that "
                "need different proxy URLs, such as OPENAI_BASE_URL (with /v1) and "
                "ANTHROPIC_BASE_URL (without); give each its own value, then run again"
            )
        out.append(text[pos : edit.start])
        out.append(edit.new)
        pos = edit.end
    out.append(text[pos:])
    return "".join(out)


class LineIndex:
    """Maps a character offset to its 1-based line number."""

    def __init__(self, text: str) -> None:
        self._starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]

    def line(self, offset: int) -> int:
        return bisect.bisect_right(self._starts, offset)
