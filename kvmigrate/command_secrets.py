"""Passwords that command lines take in flags of their own: `curl -u user:pw`,
`mysql -ppw`. Neither flag names a secret in words, so only on the line of a command that
reads them so are they taken for one: `docker run -u 1000:1000` and `ssh -p2222` keep
theirs.

Linear in the text: each line holding a command is read once, from the command on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# The commands, as words of their own (not `libcurl_version`, not `mysql_config`).
_COMMAND = re.compile(
    r"(?i)(?<![\w./-])(?:curl|mysql(?:dump|admin|import|show|check|slap)?|mariadb)(?![\w.-])"
)
# `-u user:pw`, `-uuser:pw`, `--user user:pw`, `--user=user:pw`, quoted or not: the
# password is what follows the first colon.
_USER = re.compile(r"(?<!\S)(?:-u[ \t]*|--user(?:[ \t]+|=))[\"']?[^\s:\"']*+:(?P<pw>[^\s\"']++)")
# MySQL's password glued to its flag (`-pPW`); a lone `-p` asks for it instead.
_GLUED_PASSWORD = re.compile(r"(?<!\S)-p[\"']?(?P<pw>[^\s\"']++)")


def command_secret_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each password given to a command's flag, in order."""
    lowered = text.lower()
    if "curl" not in lowered and "mysql" not in lowered and "mariadb" not in lowered:
        return
    pos = 0
    while (command := _COMMAND.search(text, pos)) is not None:
        newline = text.find("\n", command.end())
        line_end = len(text) if newline < 0 else newline
        spans = [
            match.span("pw")
            for pattern in (_USER, _GLUED_PASSWORD)
            for match in pattern.finditer(text, command.end(), line_end)
        ]
        yield from sorted(spans)
        pos = line_end
