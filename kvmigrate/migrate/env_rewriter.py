"""`.env` files: `[export] OPENAI_BASE_URL=value` (or ANTHROPIC_BASE_URL, set to the proxy's
root), quoted or not, with trailing comments kept."""

from __future__ import annotations

import re

from kvmigrate.migrate.findings import Action, Edit, Finding, ScanResult
from kvmigrate.migrate.python_rules import AZURE
from kvmigrate.migrate.values import (
    KEY_VARS,
    OPENAI_URL_VARS,
    URL_VARS,
    RewriteOptions,
    Verdict,
    is_azure_url,
    judge_key,
    judge_url,
)

_ASSIGN = re.compile(r"^[ \t]*(?:export[ \t]+)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*")
# The legacy SDK (and LangChain) read OPENAI_API_BASE as an Azure resource when this is set.
_AZURE_TYPE = re.compile(
    r"^[ \t]*(?:export[ \t]+)?OPENAI_API_TYPE[ \t]*=[ \t]*[\"']?azure", re.MULTILINE | re.IGNORECASE
)


def scan_env(text: str, rel: str, options: RewriteOptions) -> ScanResult:
    result = ScanResult(deploy_kind="dotenv")
    azure = _AZURE_TYPE.search(text) is not None
    offset = 0
    open_quote: str | None = None  # inside a multi-line quoted value: its lines are data
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        body = line.rstrip("\r\n")
        match = None if open_quote else _ASSIGN.match(body)
        span: tuple[int, int] | None = None
        if open_quote:
            open_quote = None if _closing_quote(body, 0, open_quote) is not None else open_quote
        elif match and (span := _value_span(body, match.end())) is None:
            open_quote = body[match.end()]  # only a quoted value can be unterminated
        if match and match["key"] in KEY_VARS and span is not None:
            result.secrets.add(body[span[0] : span[1]])  # masked even in diff context lines
        if match and _wanted(match["key"], options):
            if span is None:
                result.findings.append(
                    Finding(rel, number, "env", "dotenv", Action.NEEDS_HUMAN,
                            f"{match['key']}: unterminated or multi-line quoted value")
                )  # fmt: skip
            else:
                start, end = span
                value = body[start:end]
                new = _judge(result, rel, number, match["key"], value, options, azure)
                if new is not None:
                    result.edits.append(Edit(offset + start, offset + end, new))
        offset += len(line)
    return result


def _wanted(key: str, options: RewriteOptions) -> bool:
    return key in URL_VARS or (options.proxy_key is not None and key in KEY_VARS)


def _value_span(body: str, start: int) -> tuple[int, int] | None:
    """The value's characters, inside its quotes if quoted, before any ` # comment`;
    None for a quoted value that does not end on this line."""
    if start < len(body) and body[start] in "\"'":
        close = _closing_quote(body, start + 1, body[start])
        return None if close is None else (start + 1, close)
    comment = re.search(r"[ \t]#", body[start:])
    end = start + comment.start() if comment else len(body)
    return start, len(body[:end].rstrip(" \t"))


def _closing_quote(body: str, start: int, quote: str) -> int | None:
    """Where `quote` closes in body[start:]; a backslash escapes inside double quotes."""
    close = start
    while close < len(body):
        if body[close] == "\\" and quote == '"':
            close += 2
            continue
        if body[close] == quote:
            return close
        close += 1
    return None


def _judge(
    result: ScanResult,
    rel: str,
    line: int,
    key: str,
    value: str,
    options: RewriteOptions,
    azure: bool,
) -> str | None:
    """Record a finding for one value; return its replacement when it is rewritten.
    `azure`: the file sets OPENAI_API_TYPE=azure."""

    def add(action: Action, message: str, old: str | None = None, new: str | None = None) -> None:
        result.findings.append(Finding(rel, line, "env", "dotenv", action, message, old, new))

    if key in KEY_VARS:
        assert options.proxy_key is not None
        verdict = judge_key(value, options.proxy_key)
        if verdict is Verdict.REWRITE:
            result.secrets.add(value)
            add(Action.REWRITE, f"{key} -> the proxy key", None, "<proxy key>")
            return options.proxy_key
        if verdict is Verdict.REFERENCE:
            add(Action.NEEDS_HUMAN, f"{key} refers to {value}: point that at the proxy key")
        return None
    proxy = options.url_for(key)
    verdict = judge_url(value, proxy)
    if verdict is Verdict.REWRITE and (is_azure_url(value) or (azure and key in OPENAI_URL_VARS)):
        add(Action.FLAGGED, f"{key}: {value!r} is Azure OpenAI: not rewritten", value, AZURE.flag)
        return None
    if verdict is Verdict.REWRITE:
        add(Action.REWRITE, f"{key}: {value!r} -> proxy", value, proxy)
        return proxy
    if verdict is Verdict.REFERENCE:
        add(Action.NEEDS_HUMAN, f"{key} refers to {value}: point that at the proxy", value)
    elif verdict is Verdict.NOT_URL:
        add(Action.NEEDS_HUMAN, f"{key}: {value!r} is not a URL", value)
    return None
