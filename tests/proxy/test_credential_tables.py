"""Every entry of every credential list, one by one, against a real proxy and a recording
upstream: removing any entry from `kvmigrate/proxy/headers.py` fails a row here."""

from __future__ import annotations

import http.client
import json
from urllib.parse import parse_qsl, urlencode, urlsplit

import msgspec
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from proxy_support import VLLM_MODEL, ProxyFactory, Recorded, proxy_config
from test_forwarding import BODY, wait_for_both

from kvmigrate.proxy import build_proxy_app
from kvmigrate.proxy.headers import bearer_token, is_credential_param, relayed_response_headers
from kvmigrate.serving import BackgroundServer

# What the candidate must never see: the credential headers the proxy knows by name, and
# vendor key headers it does not (the candidate allowlist keeps those out).
CREDENTIAL_HEADERS = (
    "authorization",
    "api-key",
    "x-api-key",
    "cookie",
    "openai-organization",
    "openai-project",
    "x-goog-api-key",
    "anthropic-api-key",
    "ocp-apim-subscription-key",
    "x-auth-token",
    "proxy-authorization",
)
CREDENTIAL_QUERY_PARAMS = (
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
    # Named for the secret they hold, outside the list above (an outside probe's).
    "X-Amz-Security-Token",
    "X-Amz-Signature",
    "X-Amz-Credential",
    "client_secret",
    "access-token",
    "auth_token",
    "x-goog-api-key",
    "password",
    "refresh_token",
    "bearer",
    "token ",
)
# What the candidate does see: ids, content negotiation and the SDK's self-description.
CANDIDATE_HEADERS = (
    "content-type",
    "accept",
    "user-agent",
    "x-session-id",
    "x-request-id",
    "openai-beta",
    "traceparent",
    "tracestate",
    "x-stainless-lang",
)
# Allowed only where a backend's `candidate_headers` names it: a client must not be able to
# inject emulator faults into a candidate in production.
CONFIGURED_ONLY = ("x-emulator-fault",)
ALLOWED_VALUES = {
    "content-type": "application/json",
    "accept": "application/json",
    "x-emulator-fault": "none",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
}
SHADOW = "{mode: shadow, shadow_sample: 1.0}"


def secret(name: str) -> str:
    return f"SECRET-{name}"


def send(url: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", path, body=BODY, headers=headers)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def split_calls(seen: list[Recorded]) -> tuple[Recorded, Recorded]:
    wait_for_both(seen)
    assert len(seen) == 2, seen
    primary = next(r for r in seen if b'"gpt-4o-mini"' in r.body)
    candidate = next(r for r in seen if VLLM_MODEL.encode() in r.body)
    return primary, candidate


def lower_headers(recorded: Recorded) -> dict[str, str]:
    return {k.lower(): v for k, v in recorded.headers.items()}


def query_of(recorded: Recorded) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(recorded.path).query, keep_blank_values=True))


def client_headers() -> dict[str, str]:
    headers = {name: secret(name) for name in CREDENTIAL_HEADERS}
    headers["authorization"] = "Bearer " + secret("authorization")
    allowed = (*CANDIDATE_HEADERS, *CONFIGURED_ONLY)
    headers.update({name: ALLOWED_VALUES.get(name, f"value-{name}") for name in allowed})
    # Headers the client names in `Connection` are hop-by-hop too (RFC 9110 section 7.6.1).
    headers.update({"Connection": "X-Hop-A,X-Hop-B", "X-Hop-A": "1", "X-Hop-B": "2"})
    return headers


# A blank parameter too: dropping a credential must not drop it.
CREDENTIALS_QUERY = "/v1/chat/completions?" + urlencode(
    [(name, secret("q-" + name)) for name in CREDENTIAL_QUERY_PARAMS]
    + [("flag", ""), ("trace", "keep")]
)


@pytest.fixture
def shadowed(
    make_proxy: ProxyFactory, recording_upstream: tuple[BackgroundServer, list[Recorded]]
) -> tuple[Recorded, Recorded]:
    """The primary's and the candidate's copy of one request carrying every credential."""
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url, rollout=SHADOW)
    status, body = send(proxy.url, CREDENTIALS_QUERY, client_headers())
    assert status == 200, body
    return split_calls(seen)


@pytest.mark.parametrize("name", CREDENTIAL_HEADERS)
def test_candidate_never_gets_the_credential_header(
    shadowed: tuple[Recorded, Recorded], name: str
) -> None:
    _, candidate = shadowed
    assert name not in lower_headers(candidate)
    assert secret(name) not in json.dumps(candidate.headers)


@pytest.mark.parametrize("name", CREDENTIAL_QUERY_PARAMS)
def test_candidate_never_gets_the_credential_query_param(
    shadowed: tuple[Recorded, Recorded], name: str
) -> None:
    primary, candidate = shadowed
    assert name not in query_of(candidate)
    assert secret("q-" + name) not in candidate.path
    assert query_of(candidate)["trace"] == "keep"  # the rest of the query still goes
    assert query_of(candidate)["flag"] == ""
    # The client's own credentials are meant for the primary when it has no key of its own.
    assert query_of(primary)[name] == secret("q-" + name)


@pytest.mark.parametrize("name", CANDIDATE_HEADERS)
def test_candidate_gets_each_allowlisted_header(
    shadowed: tuple[Recorded, Recorded], name: str
) -> None:
    _, candidate = shadowed
    assert lower_headers(candidate)[name] == ALLOWED_VALUES.get(name, f"value-{name}")


@pytest.mark.parametrize("name", CONFIGURED_ONLY)
def test_candidate_gets_no_test_bed_header_by_default(
    shadowed: tuple[Recorded, Recorded], name: str
) -> None:
    primary, candidate = shadowed
    assert name not in lower_headers(candidate)
    assert lower_headers(primary)[name] == ALLOWED_VALUES[name]  # the primary gets everything


def test_a_backends_candidate_headers_extend_the_allowlist(
    make_proxy: ProxyFactory, recording_upstream: tuple[BackgroundServer, list[Recorded]]
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url,
        vllm_url=upstream.url,
        rollout=SHADOW,
        vllm_extra=", candidate_headers: [X-Emulator-Fault, Connection]",
    )
    status, body = send(proxy.url, "/v1/chat/completions", client_headers())
    assert status == 200, body
    _, candidate = split_calls(seen)
    headers = lower_headers(candidate)
    assert headers["x-emulator-fault"] == ALLOWED_VALUES["x-emulator-fault"]
    assert "connection" not in headers


# Named in `candidate_headers` by a config the loader did not read (built in code): the
# proxy still keeps every one from the candidate. The loader refuses them all
# (tests/config/test_config.py), the last line of defence is tested here.
CONFIGURED_CREDENTIALS = (
    "x-goog-api-key",
    "x-amz-security-token",
    "ocp-apim-subscription-key",
    "cookie",
    "authorization",
    "x-api-key",
    "proxy-authorization",
    "api-key",
)


def test_credential_headers_named_in_a_config_built_in_code_never_reach_the_candidate(
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
) -> None:
    upstream, seen = recording_upstream
    config = proxy_config(upstream.url, upstream.url, SHADOW)
    vllm = msgspec.structs.replace(
        config.backends["vllm"], candidate_headers=("x-emulator-fault", *CONFIGURED_CREDENTIALS)
    )
    config = msgspec.structs.replace(config, backends={**config.backends, "vllm": vllm})
    headers = client_headers() | {name: secret(name) for name in CONFIGURED_CREDENTIALS}
    with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
        status, body = send(proxy.url, "/v1/chat/completions", headers)
    assert status == 200, body
    primary, candidate = split_calls(seen)
    received = lower_headers(candidate)
    assert received["x-emulator-fault"] == ALLOWED_VALUES["x-emulator-fault"]
    for name in CONFIGURED_CREDENTIALS:
        assert name not in received, name
        assert secret(name) not in json.dumps(candidate.headers), name
        if name != "proxy-authorization":  # hop-by-hop: for the proxy, no backend's
            assert secret(name) in lower_headers(primary)[name]  # the primary's to have


@pytest.mark.parametrize("name", ["connection", "x-hop-a", "x-hop-b"])
def test_no_backend_gets_a_header_named_in_connection(
    shadowed: tuple[Recorded, Recorded], name: str
) -> None:
    for recorded in shadowed:
        assert name not in lower_headers(recorded)


@pytest.mark.parametrize("name", [n for n in CREDENTIAL_HEADERS if n != "proxy-authorization"])
def test_primary_gets_the_clients_credentials_when_they_are_its_own(
    shadowed: tuple[Recorded, Recorded], name: str
) -> None:
    primary, _ = shadowed
    assert secret(name) in lower_headers(primary)[name]


@pytest.fixture
def behind_master_key(
    make_proxy: ProxyFactory, recording_upstream: tuple[BackgroundServer, list[Recorded]]
) -> tuple[Recorded, Recorded]:
    """With a master key the client's credentials are the proxy's: no backend gets them."""
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url,
        vllm_url=upstream.url,
        rollout=SHADOW,
        extra="server: {master_key: sk-master}",
    )
    headers = client_headers()
    headers["authorization"] = "Bearer sk-master"
    status, body = send(proxy.url, CREDENTIALS_QUERY, headers)
    assert status == 200, body
    return split_calls(seen)


# The names the proxy strips by name (the vendor ones reach a primary with its own key:
# they are not credentials the proxy knows how to read).
KNOWN_CREDENTIAL_HEADERS = (
    "api-key",
    "x-api-key",
    "cookie",
    "openai-organization",
    "openai-project",
)


@pytest.mark.parametrize("name", KNOWN_CREDENTIAL_HEADERS)
def test_primary_behind_a_master_key_gets_no_client_credential_header(
    behind_master_key: tuple[Recorded, Recorded], name: str
) -> None:
    for recorded in behind_master_key:
        assert name not in lower_headers(recorded)
        assert "sk-master" not in json.dumps(recorded.headers)
        # Stripping a credential skips that header only, not the ones after it.
        assert lower_headers(recorded)["x-session-id"] == "value-x-session-id"


@pytest.mark.parametrize("name", CREDENTIAL_QUERY_PARAMS)
def test_primary_behind_a_master_key_gets_no_credential_query_param(
    behind_master_key: tuple[Recorded, Recorded], name: str
) -> None:
    for recorded in behind_master_key:
        assert name not in query_of(recorded)


@pytest.fixture
def own_keys(
    make_proxy: ProxyFactory, recording_upstream: tuple[BackgroundServer, list[Recorded]]
) -> tuple[Recorded, Recorded]:
    """Both backends have a key of their own: it replaces whatever key the client sent."""
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url,
        vllm_url=upstream.url,
        rollout=SHADOW,
        hosted_extra=", api_key: sk-own-hosted",
        vllm_extra=", api_key: sk-own-vllm",
    )
    status, body = send(proxy.url, "/v1/chat/completions", client_headers())
    assert status == 200, body
    return split_calls(seen)


@pytest.mark.parametrize("name", ["authorization", "api-key", "x-api-key"])
def test_a_backends_own_key_replaces_the_clients(
    own_keys: tuple[Recorded, Recorded], name: str
) -> None:
    primary, candidate = own_keys
    assert lower_headers(primary)["authorization"] == "Bearer sk-own-hosted"
    assert lower_headers(candidate)["authorization"] == "Bearer sk-own-vllm"
    for recorded in own_keys:
        assert secret(name) not in json.dumps(recorded.headers)
        assert lower_headers(recorded)["x-session-id"] == "value-x-session-id"


def test_a_query_with_no_credential_is_relayed_byte_for_byte(
    make_proxy: ProxyFactory, recording_upstream: tuple[BackgroundServer, list[Recorded]]
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url, rollout=SHADOW)
    query = "?trace=a%20b&flag=&note=a%26b%3Dc"
    status, body = send(proxy.url, "/v1/chat/completions" + query, client_headers())
    assert status == 200, body
    for recorded in split_calls(seen):
        assert recorded.path.endswith(query)


def cimulti(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ((("Authorization", "Bearer sk-1"),), "sk-1"),
        ((("authorization", "bearer  sk-2 "),), "sk-2"),
        ((("Authorization", "Basic dXNlcjpwYXNz"),), None),
        ((("Authorization", "Basic a"), ("api-key", "k")), None),  # an explicit scheme wins
        ((("api-key", "az-3"),), "az-3"),
        ((("x-api-key", "x-4"),), "x-4"),
        ((("api-key", "az-5"), ("x-api-key", "x-5")), "az-5"),
        ((), None),
    ],
)
def test_the_clients_key_is_read_from_each_header_a_client_may_use(
    headers: tuple[tuple[str, str], ...], key: str | None
) -> None:
    assert bearer_token(cimulti(*headers)) == key


def test_relayed_answers_drop_every_hop_by_hop_header_and_keep_the_rest() -> None:
    upstream = cimulti(
        ("Connection", "keep-alive"),
        ("Content-Type", "application/json"),
        ("Transfer-Encoding", "chunked"),
        ("x-request-id", "up-1"),
        ("Server", "upstream"),
        ("openai-processing-ms", "12"),
    )
    relayed = relayed_response_headers(upstream, [("x-kvmigrate-backend", "hosted")])
    assert relayed == [
        ("Content-Type", "application/json"),
        ("openai-processing-ms", "12"),
        ("x-kvmigrate-upstream-request-id", "up-1"),
        ("x-kvmigrate-backend", "hosted"),
    ]


@pytest.mark.parametrize(
    ("name", "credential"),
    [
        *[(name, True) for name in CREDENTIAL_QUERY_PARAMS],
        ("API-KEY", True),
        ("oauth_signature", True),
        ("my.sig", True),
        # What clients and APIs send that holds no secret, relayed as it came.
        ("api-version", False),
        ("beta", False),
        ("limit", False),
        ("after", False),
        ("order", False),
        ("include[]", False),
        ("starting_after", False),
        ("signal", False),
        ("stream", False),
        ("trace", False),
    ],
)
def test_a_query_parameter_is_a_credential_by_its_name(name: str, credential: bool) -> None:
    assert is_credential_param(name) is credential
