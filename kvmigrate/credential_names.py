"""Whether a header or parameter name says it carries a credential.

An allowlist keeps a client's credentials from the candidate; these names are what a
config may not add to it, what the proxy drops even when one is added, and which query
parameters of a URL are hidden when it is shown (`?api-key=`, `?sig=`). Vendors name
their keys as they like (`X-Goog-Api-Key`, `Ocp-Apim-Subscription-Key`,
`X-Amz-Security-Token`), so the name is read for what it says, not looked up.
"""

from __future__ import annotations

import re

# The headers the proxy knows carry a client's credentials or name its account.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "api-key", "x-api-key", "cookie", "openai-organization", "openai-project"}
)
# Words anywhere in the name (`x-auth-token`, `oauth_signature`, `set-cookie`), and short
# ones only as a whole part of it: `sig`, not `signal`; `key`, not `keyboard`.
_WORDS = ("token", "secret", "passw", "signature", "credential", "apikey", "bearer", "auth")
_PARTS = ("key", "sig", "pwd", "pass", "jwt")
_SEPARATORS = r"[-_.\s\[\]]"


def _pattern(words: tuple[str, ...], parts: tuple[str, ...]) -> re.Pattern[str]:
    whole = "|".join(parts)
    # For lower-cased names: a case-insensitive search costs three times as much.
    return re.compile("|".join(words) + rf"|(?:^|{_SEPARATORS})(?:{whole})(?={_SEPARATORS}|$)")


# A header: a cookie is a session's credential.
_HEADER = _pattern((*_WORDS, "cookie"), _PARTS)
# A query parameter: an OAuth authorization `code` too.
_PARAM = _pattern((*_WORDS, "cookie"), (*_PARTS, "code"))


def is_credential_header(name: str) -> bool:
    """Whether a header named `name` may carry a credential. `X-Session-ID` does not: it
    names a conversation, and no one can act with it."""
    name = name.strip().lower()
    return name in CREDENTIAL_HEADERS or _HEADER.search(name) is not None


def is_credential_param_name(name: str) -> bool:
    """Whether a query parameter named `name` may carry a credential."""
    return _PARAM.search(name.strip().lower()) is not None
