"""A credential that never shows itself in logs, reprs or tracebacks."""

from __future__ import annotations

import hmac
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from kvmigrate.credential_names import is_credential_param_name


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
        try:
            given = candidate.encode(errors="surrogateescape")  # UTF-8, the default
        except UnicodeEncodeError:  # a lone surrogate no bytes decode to: no key's
            return False
        return hmac.compare_digest(self._value.encode(errors="surrogateescape"), given)

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        # Tagged with the class, so the hash is not the bare string's.
        return hash((Secret, self._value))


# Query parameters that carry a credential in a store URL: redis-py and libpq both take the
# password there too (`redis://cache/0?password=...`, `postgresql://db/kv?password=...`).
_SECRET_PARAM = re.compile(r"pass|secret|token|credential|key", re.IGNORECASE)


def safe_url(url: str) -> str:
    """A URL (a store's, a backend's) without its password or a credential in its query,
    fit for logs, errors and reports."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a URL urlsplit cannot read: nothing of it is shown
        return "<a URL that does not parse>"
    if password is None:
        url = _unread_userinfo_hidden(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    secret_params = any(_secret_param(name) for name, _ in params)
    if password is None and not secret_params:
        return url  # as written: urlunsplit would rewrite `sqlite:////abs` to `sqlite:///abs`
    if secret_params:
        hidden = [(n, "***" if _secret_param(n) else v) for n, v in params]
        parts = parts._replace(query=urlencode(hidden, safe="*"))
    if password is None:
        return urlunsplit(parts)
    # As urlsplit reads a netloc: the userinfo ends at the last `@`, the user at its first `:`.
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=user + ":***@" + host))


# A URL inside a message: from the start of its scheme (each run of scheme letters tried
# once), to the next space or quote.
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_CLOSING = ".,;:!?)]}"  # after a URL in a sentence, not part of it


def safe_text(text: str) -> str:
    """`text` (an exception's message, a log line) with each URL in it shown as `safe_url`
    shows it: an HTTP client's error names the URL it was given, userinfo and query too."""
    return _URL_IN_TEXT.sub(_safe_match, text) if "://" in text else text


def _safe_match(match: re.Match[str]) -> str:
    url = match.group()
    bare = url.rstrip(_CLOSING)
    return safe_url(bare) + url[len(bare) :]


def _secret_param(name: str) -> bool:
    return _SECRET_PARAM.search(name) is not None or is_credential_param_name(name)


def _unread_userinfo_hidden(url: str) -> str:
    """`url` less a `user:password@` that urlsplit did not read as one, the URL being
    written wrong (`redis//app:pw@cache`, `app:pw@db/kv`): the `:`-holding part just
    before the last `@` goes, user and all."""
    before, at, after = url.rpartition("@")
    if not at:
        return url
    head, slash, userinfo = before.rpartition("/")
    return f"{head}{slash}***@{after}" if ":" in userinfo else url
