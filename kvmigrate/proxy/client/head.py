"""A message's head as bytes: its start line, a line per header, its framing lines and the
blank line. One place for both directions: the upstream client's requests and the answers
the proxy writes to its clients (kvmigrate.proxy.client_answer)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class InvalidHeader(ValueError):
    """A header would break the message's framing (a line break), or cannot be encoded."""


def encode_head(
    start: Sequence[str], headers: Iterable[tuple[str, str]], tail: Sequence[str]
) -> bytes:
    """`start` and `tail` are whole lines, each ending in CRLF; `tail` ends with the blank
    line. A CR or LF anywhere else would end the head early and let the rest be read as
    another message: refused, naming the header."""
    lines = [*start, *(f"{name}: {value}\r\n" for name, value in headers), *tail]
    text = "".join(lines)
    if text.count("\n") != len(lines) or text.count("\r") != len(lines):
        bad = next((line for line in lines if line.count("\r") + line.count("\n") != 2), "")
        raise InvalidHeader(f"the `{bad.partition(':')[0]!r}` line holds a line break")
    try:
        # Header bytes the proxy received go out as they came (decoded with surrogateescape).
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise InvalidHeader(f"a header cannot be encoded ({exc.reason})") from None
