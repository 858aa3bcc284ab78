"""A small JavaScript/TypeScript tokenizer: enough to tell code from strings and comments.

The JS rewriter only edits string literals in known positions, so it needs exact token
boundaries, not a full parse. Regex literals are told apart from division by the token
before them, the usual heuristic, which is right for the code clients are written in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Tok(Enum):
    IDENT = "ident"
    STRING = "string"  # '...' or "..."
    TEMPLATE = "template"  # `...`, possibly with ${...}
    PUNCT = "punct"
    OTHER = "other"  # numbers, regex literals


@dataclass(frozen=True, slots=True)
class Token:
    kind: Tok
    text: str
    start: int
    end: int


class TokenizeError(ValueError):
    pass


_SPACE = re.compile(r"(?:\s+|//[^\n]*|/\*.*?\*/)+", re.S)
_IDENT = re.compile(r"[A-Za-z_$][\w$]*")
_NUMBER = re.compile(r"\d[\w.]*|\.\d[\w]*")
_PUNCT = re.compile(
    r"\?\?=?|\?\.|\.\.\.|=>|[=!]=?=?|\+\+|--|\*\*=?|<<=?|>>>?=?|&&=?|\|\|=?"
    r"|[-+*/%&|^<>]=?|[{}()\[\];,.:?~@#]"
)
# A `/` after one of these starts a regex literal; after anything else it divides.
_REGEX_BEFORE = frozenset(
    ["(", ",", "=", ":", "[", "!", "&", "|", "?", "{", "}", ";", "+", "-", "*", "%", "<", ">",
     "~", "^", "=>", "==", "===", "!=", "!==", "&&", "||", "??", "+=", "-=", "*=", "return",
     "typeof", "case", "do", "else", "in", "of", "new", "delete", "void", "throw", "yield",
     "await"]
)  # fmt: skip


def tokenize(src: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(src):
        space = _SPACE.match(src, pos)
        if space:
            pos = space.end()
            continue
        ch = src[pos]
        if ch in "'\"":
            end = _string_end(src, pos)
            kind = Tok.STRING if end > pos + 1 else Tok.OTHER
            tokens.append(Token(kind, src[pos:end], pos, end))
        elif ch == "`":
            end = _template_end(src, pos)
            tokens.append(Token(Tok.TEMPLATE, src[pos:end], pos, end))
        elif ch == "/" and _regex_allowed(tokens):
            end = _regex_end(src, pos)
            tokens.append(Token(Tok.OTHER, src[pos:end], pos, end))
        else:
            end = _simple(src, pos, tokens)
        pos = end
    return tokens


def _simple(src: str, pos: int, tokens: list[Token]) -> int:
    for pattern, kind in ((_IDENT, Tok.IDENT), (_NUMBER, Tok.OTHER), (_PUNCT, Tok.PUNCT)):
        match = pattern.match(src, pos)
        if match:
            tokens.append(Token(kind, match.group(), pos, match.end()))
            return match.end()
    # Anything else (non-ASCII identifiers, stray characters) cannot hide a string.
    tokens.append(Token(Tok.OTHER, src[pos], pos, pos + 1))
    return pos + 1


def _regex_allowed(tokens: list[Token]) -> bool:
    if not tokens:
        return True
    last = tokens[-1]
    return last.kind in (Tok.PUNCT, Tok.IDENT) and last.text in _REGEX_BEFORE


def _string_end(src: str, pos: int) -> int:
    quote = src[pos]
    i = pos + 1
    while i < len(src):
        ch = src[i]
        if ch == "\\":
            i += 2
            continue
        if ch == quote:
            return i + 1
        if ch == "\n":
            break
        i += 1
    # JSX text such as <p>Don't</p> has a lone quote: take it as one character and go on.
    return pos + 1


def _template_end(src: str, pos: int) -> int:
    i = pos + 1
    while i < len(src):
        ch = src[i]
        if ch == "\\":
            i += 2
        elif ch == "`":
            return i + 1
        elif src.startswith("${", i):
            i = _substitution_end(src, i + 2)
        else:
            i += 1
    raise TokenizeError(f"unterminated template literal at offset {pos}")


def _substitution_end(src: str, pos: int) -> int:
    """Skip a `${ ... }` body, which may itself hold strings, templates and braces."""
    depth = 1
    i = pos
    while i < len(src):
        ch = src[i]
        if ch in "'\"":
            i = _string_end(src, i)
            continue
        if ch == "`":
            i = _template_end(src, i)
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise TokenizeError(f"unterminated ${{...}} at offset {pos}")


def _regex_end(src: str, pos: int) -> int:
    i = pos + 1
    in_class = False
    while i < len(src) and src[i] != "\n":
        ch = src[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            in_class = True
        elif ch == "]":
            in_class = False
        elif ch == "/" and not in_class:
            flags = _IDENT.match(src, i + 1)
            return flags.end() if flags else i + 1
        i += 1
    # Not a regex after all (a JSX closing tag `</div>`): the slash alone is the token.
    return pos + 1
