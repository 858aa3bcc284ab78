"""Credentials in lines of code and config: `kvmigrate rewrite`'s diffs, findings, errors.

Unlike `redaction.redact_text` (prompts), these are a program's own lines, shown to review
an edit: only values that can be credentials are masked, and references to one
(`${OPENAI_API_KEY}`, `os.environ["X"]`) stay, so the rest of each line stays readable.
Which names hold a credential is `named_secrets.is_secret_name`'s to say, as for prompts.
"""

from __future__ import annotations

import re

from kvmigrate.named_secrets import is_secret_name
from kvmigrate.redaction import SECRET_PATTERNS, VENDOR_KEY, vendor_key
from kvmigrate.url_passwords import mask_url_passwords

MASK = "********"
# `NAME=value`, `NAME: value`, `"name": "value"`, `env["NAME"] = value`, `name := value`,
# and in a diff's added or removed line (`-NAME=value`).
_CREDENTIAL_ASSIGNMENT = re.compile(
    r"(?:(?<=^[-+])|(?<![\w.-]))(?P<name>[A-Za-z_][\w.-]*+)(?P<close>[\"'`]?\]?)(?P<op>\s*(?::=|=>|=|:)\s*)(?!=)"
)
_VALUE = re.compile(r"\"[^\"\n]*\"?|'[^'\n]*'?|`[^`\n]*`?|[^\s\"'`,;)\]}]+")
# What names a secret without being one: `${VAR}`, `{{ secrets.X }}`, `os.environ/X`, a call.
_REFERENCE = re.compile(r"[\"'`]?(?:\$|\{\{|os\.environ|process\.env|[A-Za-z_][\w.]*\()")
# A YAML block scalar's indicator (`password: |`) is no value: the lines below hold it.
_BLOCK = re.compile(r"[|>][-+0-9]*\s*(?:#.*)?$")
# Kubernetes env lists give a name and its value apart: on two lines (`- name: X`, then
# `value: y`), or in one flow mapping (`- {name: X, value: y}`).
_ENV_NAME = re.compile(r"(?:^|[\s-])name\s*:\s*[\"']?(?P<name>[\w.-]++)[\"']?\s*$")
_ENV_VALUE = re.compile(r"^(?P<lead>.*?\bvalue\s*:\s*)(?P<value>\S.*)$")
_FLOW_NAME = re.compile(r"(?<![\w-])[\"']?name[\"']?\s*:\s*[\"']?(?P<name>[\w.-]++)[\"']?\s*[,}]")
_FLOW_VALUE = re.compile(
    r"(?<![\w-])[\"']?value[\"']?\s*:\s*"
    r"(?P<value>\"[^\"\n]*\"?|'[^'\n]*'?|[^\s,}\"']++(?:[ \t]+[^\s,}]++)*+)"
)
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----")
_PEM_BODY = re.compile(r"[A-Za-z0-9+/=]{8,}")
# The characters that open a line of a unified diff; a YAML line's own indent follows.
_DIFF_MARKS = "+- "


def _masked_value(text: str) -> str:
    """A value as shown: its quotes kept, what they hold masked (an empty one stays)."""
    quote = text[0] if text[0] in "\"'`" else ""
    closing = quote if quote and len(text) > 1 and text.endswith(quote) else ""
    inner = text[len(quote) : len(text) - len(closing)]
    return quote + (MASK if inner else "") + closing


def _masked_assignments(line: str) -> str:
    """Each credential's value masked. A name that is no credential gives up only itself
    and its operator, so `c = OpenAI(api_key="x")` still reaches `api_key`."""
    out: list[str] = []
    pos = 0
    while (match := _CREDENTIAL_ASSIGNMENT.search(line, pos)) is not None:
        out.append(line[pos : match.end()])
        pos = match.end()
        if not is_secret_name(match["name"]):
            continue
        value = _VALUE.match(line, pos)
        if value is None:
            continue
        text = value.group()
        if _REFERENCE.match(text) or _BLOCK.match(text) or MASK in text:
            continue
        out.append(_masked_value(text))
        pos = value.end()
    out.append(line[pos:])
    return "".join(out)


def _masked_flow_entry(line: str) -> str:
    """`- {name: OPENAI_ORG_SECRET, value: x}`: the value masked when the name is a
    credential's."""
    name = _FLOW_NAME.search(line)
    if name is None or not is_secret_name(name["name"]):
        return line
    value = _FLOW_VALUE.search(line)
    if value is None or _REFERENCE.match(value["value"]):
        return line
    return line[: value.start("value")] + _masked_value(value["value"]) + line[value.end() :]


def _masked_line(line: str) -> str:
    # Shapes first: `Authorization: Bearer x` must lose its token, not just the word Bearer.
    line = VENDOR_KEY.sub(lambda m: vendor_key(m, MASK), line)
    for pattern in SECRET_PATTERNS:
        line = pattern.sub(MASK, line)
    line = mask_url_passwords(line, MASK)
    return _masked_flow_entry(_masked_assignments(line))


def _masked_pem_line(line: str) -> tuple[str, bool]:
    """A line in (or opening) a private key block, its key material masked; and whether
    the block goes on past it."""
    begin = _PEM_BEGIN.search(line)
    head, body = (line[: begin.end()], line[begin.end() :]) if begin else ("", line)
    end = _PEM_END.search(body)
    if end is not None:
        return head + _PEM_BODY.sub(MASK, body[: end.start()]) + body[end.start() :], False
    return head + _PEM_BODY.sub(MASK, body), True


def _lead(line: str) -> tuple[int, int]:
    """(where a line's indent starts, where its text starts): past a diff's mark
    (`+  key:`), read the same way on every line."""
    start = 1 if line[:1] and line[0] in _DIFF_MARKS else 0
    return start, len(line) - len(line[start:].lstrip(" \t"))


def _opens_secret_block(line: str) -> bool:
    """Whether `line` is `name: |` (or `>`) for a credential's name."""
    if "|" not in line and ">" not in line:
        return False
    return any(
        _BLOCK.match(line, match.end()) and is_secret_name(match["name"])
        for match in _CREDENTIAL_ASSIGNMENT.finditer(line)
    )


def mask_credentials(text: str) -> str:
    """`text`, lines of code or config (a diff, a parser's error), with every credential
    value masked: values assigned to credential names (on the line, in a Kubernetes env
    entry, in a YAML block below the name), a URL's password, vendor-shaped keys and
    private key blocks. Line breaks are kept, so a diff stays a diff."""
    lines = text.split("\n")
    secret_value_next = in_pem = False
    block_indent = -1  # a credential's YAML block holds the lines indented more than this
    for index, line in enumerate(lines):
        if in_pem or _PEM_BEGIN.search(line):  # its armour shown, in a block or not
            lines[index], in_pem = _masked_pem_line(line)
            continue
        start, text_start = _lead(line)
        if block_indent >= 0:
            if text_start == len(line.rstrip()) or text_start - start > block_indent:
                lines[index] = line[:text_start] + (MASK if line[text_start:].strip() else "")
                continue
            block_indent = -1
        value = _ENV_VALUE.match(line) if secret_value_next else None
        if value is not None and _BLOCK.match(value["value"]):
            block_indent = text_start - start
        elif value is not None and not _REFERENCE.match(value["value"]):
            line = value["lead"] + MASK
        name = _ENV_NAME.search(line)
        secret_value_next = name is not None and is_secret_name(name["name"])
        if _opens_secret_block(line):
            block_indent = text_start - start
        lines[index] = _masked_line(line)
    return "\n".join(lines)
