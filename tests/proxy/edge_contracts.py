"""The proxy's edges as tables, written once and run for every route and backend kind.

What each upstream may receive of a client's request, header by header and with the reason,
and what an error the proxy makes itself may say. The tests (test_upstream_contract*.py,
test_error_contract.py) compare what a recording upstream received, or what the client
got, against these tables: exactly, not by looking for one header or one word.
"""

from __future__ import annotations

import enum
import json
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from aiohttp import web

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer

# Every secret in play, each distinct from the start, so a leak names its source.
CLIENT_KEY = "sk-client-HOSTED-KEY-0001"
MASTER_KEY = "sk-master-PROXY-KEY-0002"
PRIMARY_KEY = "sk-primary-OWN-KEY-0003"
CANDIDATE_KEY = "candidate-OWN-KEY-0004"
QUERY_SECRET = "query-SECRET-0005"
COOKIE_SECRET = "cookie-SECRET-0006"
ORG_SECRET = "org-SECRET-0007"
HOP_SECRET = "hop-SECRET-0008"


class Who(enum.Enum):
    """Which upstream calls a client header may reach."""

    EVERYONE = "every upstream: ids, content negotiation, the SDK's self-description"
    PRIMARY = "the primary only: an unknown header may be anyone's credential"
    CREDENTIAL = "the primary, only when the client's key is meant for it (pass-through)"
    KEY = "the client's key to a pass-through primary; elsewhere the upstream's own key"
    NOBODY = "hop-by-hop (RFC 9110 7.6.1): ends at the proxy"
    PROXY = "set by the proxy for the call it makes, whatever the client sent"


# Each header name a client sends or an upstream may receive, and why it goes where it goes.
# An upstream that receives a name missing here fails the contract.
HEADER_CONTRACT: dict[str, tuple[Who, str]] = {
    "host": (Who.PROXY, "the upstream's own authority, set by the proxy's HTTP client"),
    "content-length": (Who.PROXY, "recomputed: the body's model name may change length"),
    "accept-encoding": (Who.PROXY, "identity: the proxy reads each answer and relays it as is"),
    "authorization": (Who.KEY, "where OpenAI-style APIs (and vLLM's --api-key) read a key"),
    "api-key": (Who.KEY, "where Azure OpenAI reads a key"),
    "x-api-key": (Who.KEY, "where Anthropic's API reads a key"),
    "cookie": (Who.CREDENTIAL, "a session credential of the hosted API's"),
    "openai-organization": (Who.CREDENTIAL, "chooses whose quota the client's key spends"),
    "content-type": (Who.EVERYONE, "the body's type"),
    "accept": (Who.EVERYONE, "content negotiation (JSON or SSE)"),
    "user-agent": (Who.EVERYONE, "the SDK's name and version"),
    "x-session-id": (Who.EVERYONE, "the conversation key; no credential"),
    "traceparent": (Who.EVERYONE, "W3C trace context: ids only"),
    "anthropic-version": (Who.EVERYONE, "the Messages API version the body is written in"),
    "x-custom-trace": (Who.PRIMARY, "unknown to the proxy"),
    "connection": (Who.NOBODY, "hop-by-hop"),
    "x-hop": (Who.NOBODY, "named in the client's Connection header"),
    "te": (Who.NOBODY, "hop-by-hop"),
    "proxy-authorization": (Who.NOBODY, "the client's credential for the proxy hop"),
}
# The OpenAI and Anthropic SDKs describe themselves in x-stainless-* headers.
SDK_PREFIX = ("x-stainless-", (Who.EVERYONE, "the SDK's self-description: no secrets"))


def contract_of(name: str) -> tuple[Who, str]:
    lower = name.lower()
    if lower.startswith(SDK_PREFIX[0]):
        return SDK_PREFIX[1]
    return HEADER_CONTRACT[lower]


# What a client sends besides what its SDK sends by itself: one header of each kind above.
CLIENT_HEADERS = {
    "X-Session-ID": "conversation-1",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "X-Custom-Trace": "t-1",
    "Cookie": "session=" + COOKIE_SECRET,
    "OpenAI-Organization": ORG_SECRET,
    "Connection": "X-Hop",
    "X-Hop": HOP_SECRET,
    "TE": "trailers",
    "Proxy-Authorization": "Basic " + HOP_SECRET,
}
CLIENT_QUERY = {"trace": "keep", "api-key": QUERY_SECRET}


class Mode(enum.Enum):
    """Who checks a client's key (docs/security.md), as the config puts it."""

    PASS_THROUGH = "pass_through"  # no master key, no key on the primary
    MASTER_KEY = "master_key"  # server.master_key; the primary has its own key
    OPEN = "open"  # no master key; the primary has its own key


@dataclass(frozen=True)
class Auth:
    """One row of the key modes: the config it needs and the key the client sends."""

    mode: Mode
    candidate_key: bool  # whether the candidate has an api_key of its own

    @property
    def client_key(self) -> str:
        return MASTER_KEY if self.mode is Mode.MASTER_KEY else CLIENT_KEY

    def server(self) -> str:
        return f"server: {{master_key: {MASTER_KEY}}}" if self.mode is Mode.MASTER_KEY else ""

    def primary_extra(self) -> str:
        return "" if self.mode is Mode.PASS_THROUGH else f", api_key: {PRIMARY_KEY}"

    def candidate_extra(self) -> str:
        return f", api_key: {CANDIDATE_KEY}" if self.candidate_key else ""

    def __str__(self) -> str:
        return self.mode.value + ("+candidate-key" if self.candidate_key else "")


AUTHS = (
    Auth(Mode.PASS_THROUGH, candidate_key=False),
    Auth(Mode.PASS_THROUGH, candidate_key=True),
    Auth(Mode.MASTER_KEY, candidate_key=True),
    Auth(Mode.OPEN, candidate_key=False),
)


@dataclass(frozen=True)
class Seen:
    """One call as an upstream received it."""

    upstream: str
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]

    @property
    def names(self) -> set[str]:
        return {k.lower() for k, _ in self.headers}

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    @property
    def route(self) -> str:
        return urlsplit(self.path).path

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))


@dataclass
class Recorder:
    """What every recording emulator received, in arrival order."""

    calls: list[Seen] = field(default_factory=list)

    def wait(self, count: int) -> list[Seen]:
        """The calls, once `count` have arrived: a copy comes after the answer, seconds
        later on a loaded machine (a generous deadline, not a bound under test)."""
        deadline = time.monotonic() + 60
        while len(self.calls) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.calls)


def recording_app(name: str, settings: EmulatorSettings, recorder: Recorder) -> web.Application:
    """A real emulator that first notes each request exactly as it arrived."""
    app = build_app(settings)

    @web.middleware
    async def note(request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
        headers = tuple(request.headers.items())
        recorder.calls.append(Seen(name, request.method, request.path_qs, headers))
        return await handler(request)

    app.middlewares.insert(0, note)
    return app


@contextmanager
def recording_emulators(
    settings: Mapping[str, EmulatorSettings],
) -> Iterator[tuple[dict[str, BackgroundServer], Recorder]]:
    recorder = Recorder()
    servers = {
        name: BackgroundServer(lambda n=name, s=s: recording_app(n, s, recorder))
        for name, s in settings.items()
    }
    for server in servers.values():
        server.start()
    try:
        yield servers, recorder
    finally:
        for server in servers.values():
            server.stop()


def expected_headers(
    sent: set[str], role: str, auth: Auth, own_key_header: str, body: bool
) -> set[str]:
    """The header names an upstream call must carry, from the names the client sent.

    `role`: `primary`, `candidate`, or `key_check` (the pass-through question to the
    primary: the client's credentials and nothing else, but the Messages API version).
    `own_key_header`: where this upstream's kind reads its own key."""
    passes = auth.mode is Mode.PASS_THROUGH
    names = {"host", "accept-encoding"} | ({"content-length"} if body else set())
    for name in sent:
        who = contract_of(name)[0]
        if role == "key_check":
            keep = who in (Who.KEY, Who.CREDENTIAL) or name == "anthropic-version"
        elif who in (Who.KEY, Who.CREDENTIAL):
            keep = role == "primary" and passes
        else:
            keep = who is Who.EVERYONE or (who is Who.PRIMARY and role == "primary")
        if keep:
            names.add(name)
    if role == "primary" and not passes:
        names.add(own_key_header)
    if role == "candidate" and auth.candidate_key:
        names.add("authorization")
    return names


def expected_query(role: str, auth: Auth, fixed: Mapping[str, str] | None = None) -> dict[str, str]:
    """The query an upstream call must carry: the client's credential parameters only
    where its key is meant for that upstream; `fixed`, what the backend's kind adds."""
    if role == "key_check":
        query = {"api-key": QUERY_SECRET}
    elif role == "primary" and auth.mode is Mode.PASS_THROUGH:
        query = dict(CLIENT_QUERY)
    else:
        query = {"trace": "keep"}
    return {**(fixed or {}), **query}


def secrets_allowed(role: str, auth: Auth) -> set[str]:
    """The secrets an upstream call may hold, anywhere in its headers or query."""
    if role in ("primary", "key_check") and auth.mode is Mode.PASS_THROUGH:
        return {CLIENT_KEY, QUERY_SECRET, COOKIE_SECRET, ORG_SECRET}
    if role == "primary":
        return {PRIMARY_KEY}
    return {CANDIDATE_KEY} if auth.candidate_key else set()


ALL_SECRETS = (
    CLIENT_KEY,
    MASTER_KEY,
    PRIMARY_KEY,
    CANDIDATE_KEY,
    QUERY_SECRET,
    COOKIE_SECRET,
    ORG_SECRET,
    HOP_SECRET,
)


def assert_call_keeps_the_contract(
    call: Seen,
    sent: set[str],
    role: str,
    auth: Auth,
    own_key: tuple[str, str],
    fixed_query: Mapping[str, str] | None = None,
) -> None:
    """The exact header names, the key's value, the query, and no secret out of place.
    `own_key`: (header, value) this upstream's kind carries its own key in."""
    body = call.method == "POST"
    assert call.names == expected_headers(sent, role, auth, own_key[0], body), call
    for name in call.names:
        contract_of(name)  # every name has a reason (KeyError: it has none)
    assert call.query == expected_query(role, auth, fixed_query), call.path
    allowed = secrets_allowed(role, auth)
    text = json.dumps([call.path, call.headers])
    leaked = [s for s in ALL_SECRETS if s in text and s not in allowed]
    assert leaked == [], (role, leaked, call)
    if role == "primary" and auth.mode is not Mode.PASS_THROUGH:
        assert call.header(own_key[0]) == own_key[1]
    if role == "candidate" and auth.candidate_key:
        assert call.header("authorization") == "Bearer " + CANDIDATE_KEY


# --- errors the proxy makes itself ------------------------------------------------------------

# What no error message may hold: where things run, and how the proxy failed inside.
_INTERNALS = (
    re.compile(r"\b127\.0\.0\.1\b|\blocalhost\b|\[::1\]|\b0\.0\.0\.0\b"),
    re.compile(r"Traceback|File \"|line \d+, in "),
    re.compile(r"(?:/[\w.-]+){2,}\.py\b|/(?:tmp|home|usr|work|var)/"),
    re.compile(r"\b\w+(?:Error|Exception)\b(?!\s*envelope)"),
    re.compile(r"\bErrno\b|\[Errno"),
    re.compile(r"Cannot connect to host|Connection refused|ssl:default"),
)


def internals_in(message: str, ports: tuple[int, ...] = ()) -> list[str]:
    """What of the proxy's insides a message shows: addresses, ports, paths, tracebacks,
    exception class names. Empty for a clean message."""
    found = [m.group() for pattern in _INTERNALS if (m := pattern.search(message))]
    found += [str(port) for port in ports if re.search(rf"(?<!\d){port}(?!\d)", message)]
    return found


def openai_error(body: bytes) -> dict[str, object]:
    """The error object of an OpenAI envelope, checked for its exact shape."""
    envelope = json.loads(body)
    assert set(envelope) == {"error"}, envelope
    error = envelope["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["type"] in ("invalid_request_error", "server_error"), error
    return dict(error)


def anthropic_error(body: bytes) -> dict[str, object]:
    """The error object of Anthropic's envelope, checked for its exact shape."""
    envelope = json.loads(body)
    assert envelope["type"] == "error"
    assert set(envelope) <= {"type", "error", "request_id"}
    error = envelope["error"]
    assert set(error) == {"type", "message"}, error
    assert isinstance(error["message"], str)
    assert error["message"]
    return dict(error)
