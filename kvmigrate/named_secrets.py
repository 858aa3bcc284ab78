"""Secrets known by their name, not their shape: `password: hunter2`, `"api_key": "..."`,
`<password>...</password>`, `--password x`, and the members of a JSON object whose key
names a secret.

A short password has no shape of its own; only the name next to it gives it away. So the
whole value goes, however it is written: quoted with spaces in it (straight, typographic
or triple quotes), JSON-escaped inside a JSON string, in backticks, as a YAML block on the
lines below, or bare to the end of its token. The name stays, so a reader still sees what
was there.

`is_secret_name` is the one rule for which names hold a secret: the recorder's redaction
and `kvmigrate rewrite`'s masking (`masked_lines.mask_credentials`) both ask it.

Linear in the text: the names are found by regexes with no nested repetition, and each
value is scanned once, from its name forward, by hand (a regex for "up to the matching
quote" backtracks on a value that never closes).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Iterator

from kvmigrate.command_secrets import command_secret_spans

SECRET = "[SECRET]"

# Where a name's last part starts: after anything but a letter or digit (`_` and `-`
# included), or at a camelCase hump (`accessToken`).
_EDGE = r"(?:(?<![^\W_])|(?<=[a-z0-9])(?=[A-Z]))"
# The last part of a name that holds a secret: `DB_PASS`, `client_secret`, `x-api-key`,
# `refresh_token`, `Set-Cookie`. The word must end the name: `passage`, `keyboard`,
# `secretary` and `max_tokens` (a count of tokens) are not secrets. A bare `key` is too
# common a name (`sort_key`, `cache_key`) to count without a telling prefix.
_WORDS = (
    r"(?:secret|credential)s?|pwd|token|auth(?:orization)?|cookie|pass"
    r"|(?:api|access|secret|private|client|signing|encryption|master|admin|session"
    r"|subscription|account|service|auth)[_-]?keys?"
)
# A password word names a secret even glued to what comes before it, as environment
# variables write it (`PGPASSWORD`): no ordinary word ends with one.
_GLUED = r"pass(?:word|wd|phrase)s?"
# An upper-case constant's last word `KEY` or `PAT` (`OPENAI_KEY`, `GITHUB_PAT`): there
# they are credentials, where code's `sort_key` or `file_pat` are not.
_CONSTANT = r"(?<=[A-Z0-9][_-])(?:KEY|PAT)S?"
# The letters a name above starts with, tested first: one cheap test that turns away most
# positions of a text before the alternatives are tried at them.
_FIRST = r"(?=[AaCcEeKkMmPpSsTt])"
# A number may follow: `OPENAI_API_KEY_2`, `DB_PASSWORD_1`, `apiKey2` are keys as well.
_NAME = rf"{_FIRST}(?:{_EDGE}(?i:{_WORDS})|(?i:{_GLUED})|{_CONSTANT})(?:[_-]?[0-9]+)?"
# Quotes that close a quoted name or a value: straight, typographic, guillemets, corner
# brackets.
_CLOSERS = "\"'`\u201d\u2019\u00bb\u00ab\u203a\u2039\u300d\u300f"
# A name, its closing quote if any (JSON-escaped too: `\"password\": \"...\"`) or index
# bracket (`env["TOKEN"] = `), then the operator: longest first, or `=` would read
# `pwd => hunter2` as the value `>`; full-width `:` and `=`, and an arrow, count too. `->`
# only spaced, as C's `token->next` is no value.
# A comparison (`password == "x"`) gives the value away as much as an assignment.
_OPERATOR = r"(?:\s*(?::=|=>|={1,3}|!==?|[:\uff1a\uff1d\u2192])|\s+->)\s*"
_ASSIGNMENT = re.compile(_NAME + rf"(?:\\*[{_CLOSERS}])?\]?" + _OPERATOR)
_KEY = re.compile(_NAME + r"\Z")
_QUOTES = "\"'`"
# Typographic quotes and the ones that close them: English double and single, German
# (opened low, closed high), Swedish (closed as opened), guillemets both ways, and CJK
# corner brackets.
_SMART_QUOTES = {
    opening: re.compile(f"[{closing}]")
    for opening, closing in {
        "\u201c": "\u201d", "\u2018": "\u2019", "\u201e": "\u201c\u201d", "\u201a": "\u2018\u2019",
        "\u201d": "\u201d", "\u00ab": "\u00bb", "\u00bb": "\u00ab", "\u2039": "\u203a",
        "\u203a": "\u2039", "\u300c": "\u300d", "\u300e": "\u300f",
    }.items()
}  # fmt: skip
_TRIPLE_QUOTES = ('"""', "'''")
# Punctuation that ends a sentence or a JSON value rather than belonging to a bare value
# (not `!` or `?`: passwords end with them as often as sentences do).
_TRAILING = ",;.:)]}>" + _CLOSERS
# A bare value that is an authorization scheme has its credentials in the next token.
_SCHEMES = frozenset({"basic", "bearer", "digest", "token", "negotiate", "apikey"})
# An authorization header in any other scheme (`SSWS x`, `Digest a="b", response="c"`)
# may spread its credentials over the line: the rest of the line goes. So do all the
# cookies of a `Cookie:` line, not only the first.
_ONE_TOKEN_SCHEMES = _SCHEMES - {"digest"}
_TOKEN = re.compile(r"\S+")
_GAP = re.compile(r"[ \t]+")
# A YAML block scalar's indicator (`password: |`, `key: >-`) ends its line: the value is
# the more indented lines below.
_BLOCK = re.compile(r"[|>][-+1-9]{0,2}[ \t]*(?:#[^\n]*)?(?=\r?\n|\Z)")
# `--password x`, `-token x`: a flag naming a secret, its value the next word.
# The dash comes first, so the search skips to each one.
_FLAG = re.compile(r"-(?<![\w-]-)-?(?P<name>[A-Za-z][\w-]*+)[ \t]+(?=[^\s-])")
# `<password>x</password>`, `<apiKey type="live">x</apiKey>`.
_TAG = re.compile(r"<(?P<name>[A-Za-z_][\w.:-]*+)(?:\s[^<>]*+)?>")


def is_secret_name(name: str) -> bool:
    """Whether a JSON member, a parameter or a variable named `name` holds a secret:
    `OPENAI_API_KEY_2`, `PGPASSWORD`, `apiKey`, `db.password`, `GITHUB_PAT`; not
    `max_tokens`, `api_key_env`, `key_file` or `passage`."""
    return _KEY.search(name) is not None


def may_name_a_secret(text: str) -> bool:
    """A cheap superset test: False means `redact_assignments` would change nothing."""
    # Bytes searches at memory speed, one per word any name above holds; spelled out, as a
    # loop over the words cost more than the searches on the short strings of a history.
    b = text.lower().encode("utf-8", "surrogateescape")
    return (
        b"pass" in b or b"pwd" in b or b"secret" in b or b"key" in b or b"token" in b
        or b"auth" in b or b"cookie" in b or b"credential" in b or b"_pat" in b
        or b"-pat" in b or b"curl" in b or b"mysql" in b or b"mariadb" in b
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
    """(start, end) of each secret value, in order, none empty and none overlapping: the
    values after secrets' names, in secret tags, after secret flags, and in command lines
    (`curl -u user:pw`)."""
    finders: list[Iterable[tuple[int, int]]] = [_assigned_values(text)]
    if "-" in text:
        finders.append(_flag_values(text))
    if "<" in text:
        finders.append(_tag_values(text))
    finders.append(command_secret_spans(text))
    return _union(heapq.merge(*finders))


def _union(spans: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Spans sorted by start, those that overlap or touch joined into one."""
    current: tuple[int, int] | None = None
    for start, end in spans:
        if current is not None and start <= current[1]:
            current = (current[0], max(current[1], end))
            continue
        if current is not None:
            yield current
        current = (start, end)
    if current is not None:
        yield current


def _line_end(text: str, pos: int, known: int) -> int:
    """The end of the line `pos` is on: `known`, the last one found, if it still is, so
    that a line is searched once however many names it holds."""
    if known >= pos:
        return known
    newline = text.find("\n", pos)
    return len(text) if newline < 0 else newline


def _assigned_values(text: str) -> Iterator[tuple[int, int]]:
    pos = 0
    newline = -1
    while (match := _ASSIGNMENT.search(text, pos)) is not None:
        newline = _line_end(text, match.end(), newline)
        value_start, value_end, pos = _value(text, match, newline)
        if value_end > value_start:
            yield value_start, value_end
        pos = max(pos, match.end())


def _value(text: str, match: re.Match[str], newline: int) -> tuple[int, int, int]:
    """(value start, value end, where to go on) for the value after a name."""
    start = match.end()
    if (block := _BLOCK.match(text, start)) is not None:
        return _block(text, match.start(), block.end())
    if (spans := _quoted(text, start, newline)) is not None:
        return spans
    name = match.group().lower()
    if "cookie" in name or ("authorization" in name and not _one_token_scheme(text, start)):
        return start, _trimmed(text, start, newline), newline
    value_end, pos = _bare(text, start)
    return start, value_end, pos


def _quoted(text: str, start: int, newline: int) -> tuple[int, int, int] | None:
    """(value start, value end, where to go on) for a value opening with a quote, maybe
    escaped (`\\"` inside a JSON string, `\\\\\\"` a level deeper); None for a bare one.

    The value ends at the same quote escaped the same way: at that level a quote escaped
    once more is part of the value. Unclosed on its line, the value is the rest of it."""
    if start < newline and (closer := _SMART_QUOTES.get(text[start])) is not None:
        return _smart_quoted(text, start + 1, newline, closer)
    for triple in _TRIPLE_QUOTES:
        if text.startswith(triple, start):
            # Python's and TOML's multi-line strings: to the closing triple, lines apart.
            end = text.find(triple, start + 3)
            return (start + 3, end, end + 3) if end >= 0 else (start + 3, len(text), len(text))
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


def _smart_quoted(
    text: str, start: int, newline: int, closer: re.Pattern[str]
) -> tuple[int, int, int]:
    found = closer.search(text, start, newline)
    return (start, found.start(), found.end()) if found else (start, newline, newline)


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
    return _trimmed(text, start, end), end


def _trimmed(text: str, start: int, end: int) -> int:
    """`end` less the trailing punctuation and spaces, unless nothing would be left."""
    cut = end
    while cut > start and (text[cut - 1] in _TRAILING or text[cut - 1].isspace()):
        cut -= 1
    return cut if cut > start else end


def _one_token_scheme(text: str, start: int) -> bool:
    token = _TOKEN.match(text, start)
    return token is not None and token.group().lower() in _ONE_TOKEN_SCHEMES


def _block(text: str, name_start: int, indicator_end: int) -> tuple[int, int, int]:
    """A YAML block scalar's value: the lines below its name's line that are indented
    more than it (blank lines among them), from its first character to its last."""
    indent = _indent(text, text.rfind("\n", 0, name_start) + 1)
    pos = text.find("\n", indicator_end) + 1
    if pos == 0:
        return indicator_end, indicator_end, indicator_end
    value_start = value_end = pos
    while pos < len(text):
        eol = text.find("\n", pos)
        eol = len(text) if eol < 0 else eol
        line = text[pos:eol]
        if line.strip():
            depth = _indent(line, 0)
            if depth <= indent:
                break
            if value_end == value_start:
                value_start = pos + depth
            value_end = pos + len(line.rstrip())
        pos = eol + 1
    return value_start, value_end, min(pos, len(text))


def _indent(text: str, line_start: int) -> int:
    end = line_start
    while end < len(text) and text[end] in " \t":
        end += 1
    return end - line_start


def _flag_values(text: str) -> Iterator[tuple[int, int]]:
    """The word after each flag naming a secret: `--password x`, `--api-key 'a b'`."""
    pos = 0
    newline = -1
    while (match := _FLAG.search(text, pos)) is not None:
        pos = match.end()
        if not is_secret_name(match["name"]):
            continue
        newline = _line_end(text, pos, newline)
        quoted = _quoted(text, pos, newline)
        if quoted is not None:
            value_start, value_end, pos = quoted
        else:
            value_start, (value_end, pos) = pos, _bare(text, pos)
        if value_end > value_start:
            yield value_start, value_end


def _tag_values(text: str) -> Iterator[tuple[int, int]]:
    """What each element naming a secret holds, up to the next closing tag (lines apart
    for a key block), or to the end of its line when none follows."""
    pos = 0
    newline = -1
    closing: int | None = None  # the next `</` at or after `pos`; -1: none is left
    while (match := _TAG.search(text, pos)) is not None:
        start = pos = match.end()
        if not is_secret_name(match["name"]):
            continue
        if closing is None or 0 <= closing < start:
            closing = text.find("</", start)
        end = closing if closing >= 0 else (newline := _line_end(text, start, newline))
        if end > start:
            yield start, end
        pos = max(pos, end)
