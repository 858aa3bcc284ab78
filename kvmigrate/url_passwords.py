"""A URL's password (`postgres://admin:pw@db`), masked wherever a URL is shown or kept:
in recorded prompts and in `kvmigrate rewrite`'s diffs. The scheme, the user and the host
stay, so a reader still sees where it pointed."""

from __future__ import annotations

import re

# What follows `://` up to the `@` that ends a user and password. Read from each `://`
# forward, and no further than the next `/`, `@` or space: a pattern that began at the
# scheme was retried from every letter of a long word before it.
_USERINFO = re.compile(r"[^\s:@/]*+:(?P<password>[^\s@/]++)@")


def mask_url_passwords(text: str, mask: str) -> str:
    """`text` with the password of each `scheme://user:password@host` replaced by `mask`."""
    pieces: list[str] = []
    done = pos = 0
    while (at := text.find("://", pos)) >= 0:
        pos = at + 3
        userinfo = _USERINFO.match(text, pos)
        if userinfo is not None:
            pieces += (text[done : userinfo.start("password")], mask)
            done = pos = userinfo.end("password")
    return "".join(pieces) + text[done:] if pieces else text
