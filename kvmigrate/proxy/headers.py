"""Which headers cross the proxy, in each direction, and whose credentials go where.

The rule that matters most: a client's hosted-API key may reach the primary (when the
primary has no key of its own), and never the self-hosted candidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlencode

from multidict import CIMultiDictProxy

from kvmigrate.credential_names import CREDENTIAL_HEADERS as CREDENTIAL_HEADERS
from kvmigrate.credential_names import is_credential_header, is_credential_param_name

# RFC 9110 section 7.6.1, plus the ones a proxy must recompute itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        # Upstream answers are relayed as they come; compressed bytes would hide usage.
        "accept-encoding",
        "content-encoding",
    }
)
# Where the APIs we relay read a key: replaced by the backend's own key when it has one.
KEY_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})
# All a candidate backend ever sees of the client's headers. An allowlist, because a
# credential can hide under any vendor's name (x-goog-api-key, anthropic-api-key,
# Ocp-Apim-Subscription-Key, ...) and the candidate must never get one.
CANDIDATE_HEADERS = frozenset(
    {
        "content-type",
        "accept",
        "user-agent",
        "x-session-id",
        "x-request-id",
        "openai-beta",
        # Anthropic's API version and feature flags: vLLM's /v1/messages may read them.
        "anthropic-version",
        "anthropic-beta",
        # W3C trace context: ids, no secrets.
        "traceparent",
        "tracestate",
    }
)
# Not `x-emulator-fault` (kvmigrate.emulator's fault injection): a client could fail the
# candidate at will in production. A test bed names it in the backend's `candidate_headers`.
CANDIDATE_HEADER_PREFIXES = ("x-stainless-",)  # the OpenAI and Anthropic SDKs' client description
# Query parameters some APIs accept a key in (Azure's `api-key`, Google's `key`, ...).
CREDENTIAL_QUERY_PARAMS = frozenset(
    {
        "api-key",
        "api_key",
        "apikey",
        "key",
        "access_token",
        "token",
        "auth",
        "authorization",
        "subscription-key",
        "x-api-key",
        "code",
        "sig",
    }
)
# Set by the proxy itself on every answer.
OWN_RESPONSE_HEADERS = frozenset(
    {
        "x-request-id",
        "x-kvmigrate-backend",
        "x-kvmigrate-overhead-ms",
        "x-kvmigrate-served-model",
        "date",
        "server",
    }
)


def upstream_headers(
    client: Mapping[str, str],
    backend_auth: Mapping[str, str] | None,
    pass_client_credentials: bool,
) -> dict[str, str]:
    """Headers for one upstream call.

    `backend_auth` carries the backend's own key, as its kind expects it; it replaces any key
    the client sent. `pass_client_credentials` is true only for the primary when it has no
    key of its own and the proxy does not use a master key (then the client's key is meant
    for the hosted API).
    """
    headers: dict[str, str] = {}
    # Headers named in `Connection` are hop-by-hop too (RFC 9110 section 7.6.1).
    listed = {t.strip().lower() for t in client.get("connection", "").split(",")}
    for name, value in client.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in listed:
            continue
        if lower in CREDENTIAL_HEADERS and not pass_client_credentials:
            continue
        if backend_auth is not None and lower in KEY_HEADERS:
            continue
        headers[name] = value
    if backend_auth is not None:
        headers.update(backend_auth)
    # Without the header any coding is acceptable (RFC 9110 section 12.5.3), and HTTP
    # clients add gzip by default: the proxy reads every answer and relays it unchanged.
    headers["Accept-Encoding"] = "identity"
    return headers


def candidate_allowlist(configured: Iterable[str]) -> frozenset[str]:
    """The allowlist above plus a backend's `candidate_headers`; a credential or hop-by-hop
    header stays out even when configured. The loader refuses such names already: this is
    for a config built some other way."""
    extra = {name.lower() for name in configured} - CREDENTIAL_HEADERS - HOP_BY_HOP
    return CANDIDATE_HEADERS | {name for name in extra if not is_credential_header(name)}


def candidate_view(
    client: Mapping[str, str], allowed: frozenset[str] = CANDIDATE_HEADERS
) -> dict[str, str]:
    """The client's headers a candidate may see: the allowlist, nothing else."""
    return {
        name: value
        for name, value in client.items()
        if (lower := name.lower()) in allowed or lower.startswith(CANDIDATE_HEADER_PREFIXES)
    }


def is_credential_param(name: str) -> bool:
    """Whether a query parameter may carry a credential, by its name: one of the names
    above, or one that says it holds a secret (`client_secret`, `X-Amz-Security-Token`,
    `refresh_token`, `x-goog-api-key`, `password`)."""
    return name.strip().lower() in CREDENTIAL_QUERY_PARAMS or is_credential_param_name(name)


def upstream_query(query_string: str, pass_client_credentials: bool) -> str:
    """The client's query string for an upstream call, less any credential in it unless
    the client's credentials are meant for this backend."""
    if pass_client_credentials or not query_string:
        return query_string
    pairs = parse_qsl(query_string, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if not is_credential_param(k)]
    return query_string if len(kept) == len(pairs) else urlencode(kept)


def credential_query(raw_query: str) -> str:
    """The query parameters that may carry a key (Azure's `api-key`, ...), in order."""
    if not raw_query:
        return ""
    pairs = parse_qsl(raw_query, keep_blank_values=True)
    return urlencode([(k, v) for k, v in pairs if is_credential_param(k)])


def relayed_response_headers(
    upstream: CIMultiDictProxy[str], extra: Iterable[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The upstream's headers minus hop-by-hop ones, plus the proxy's own, in order."""
    headers = [
        (name, value)
        for name, value in upstream.items()
        if (lower := name.lower()) not in HOP_BY_HOP and lower not in OWN_RESPONSE_HEADERS
    ]
    upstream_id = upstream.get("x-request-id")
    if upstream_id:
        headers.append(("x-kvmigrate-upstream-request-id", upstream_id))
    headers.extend(extra)
    return headers


def bearer_token(headers: CIMultiDictProxy[str]) -> str | None:
    """The client's key: `Authorization: Bearer ...`, or the `api-key` header Azure SDKs send."""
    value = headers.get("authorization")
    if value:
        scheme, _, token = value.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    return headers.get("api-key") or headers.get("x-api-key")
