"""A credential that never shows itself in logs, reprs or tracebacks."""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit, urlunsplit


class Secret:
    """Holds an API key. `str()` and `repr()` are masked; `reveal()` is the only way out."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def matches(self, candidate: str) -> bool:
        """Compare in constant time, so response timing leaks nothing about the key.

        aiohttp decodes header bytes that are not UTF-8 to lone surrogates; `surrogateescape`
        turns them back into those bytes, so such a key is simply wrong (a 401), not a crash.
        """
        return hmac.compare_digest(
            self._value.encode(errors="surrogateescape"),  # UTF-8, the default
            candidate.encode(errors="surrogateescape"),
        )

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        # Tagged with the class, so the hash is not the bare string's.
        return hash((Secret, self._value))


def safe_url(url: str) -> str:
    """A store URL without its password, fit for logs, errors and reports."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    # As urlsplit reads a netloc: the userinfo ends at the last `@`, the user at its first `:`.
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=user + ":***@" + host))
