"""What crosses the proxy: bytes, model names, and whose keys go where."""

from __future__ import annotations

import http.client
import json
import time

from proxy_support import HOSTED_MODEL, VLLM_MODEL, ProxyFactory, Recorded

from kvmigrate.serving import BackgroundServer

BODY = (
    b'{"messages": [{"role": "user", "content": "caf\xc3\xa9 \\"model\\": x"}],\n'
    b'  "model" : "gpt-4o-mini", "temperature": 0.70, "x_unknown": {"model": "keep"}}'
)


def post(url: str, body: bytes, headers: dict[str, str]) -> http.client.HTTPResponse:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def wait_for_both(seen: list[Recorded]) -> None:
    """Until the upstream has seen the primary's request and the candidate's copy. Not a
    count: with parity's noise sampling on (the default), the primary may also get a second
    call, and beside a CPU hog the primary's two arrived before the copy. The copy comes after
    the answer, seconds later under load: a generous deadline, not a bound under test."""
    deadline = time.monotonic() + 60
    while not both_seen(seen) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert both_seen(seen), f"the upstream saw {len(seen)} requests, not the primary's and the copy"


def both_seen(seen: list[Recorded]) -> bool:
    bodies = [r.body for r in list(seen)]
    return any(b'"gpt-4o-mini"' in b for b in bodies) and any(
        VLLM_MODEL.encode() in b for b in bodies
    )


def test_body_bytes_forwarded_with_only_model_changed(
    make_proxy: ProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url, vllm_url=upstream.url, rollout="{mode: split, percent: 100}"
    )
    response = post(proxy.url, BODY, {"Content-Type": "application/json"})
    assert response.status == 200
    # With the client's key passed through, the primary vouches for it before the candidate
    # serves: its model list, then the call itself.
    assert [(r.method, r.path) for r in seen] == [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
    ]
    assert seen[1].body == BODY.replace(b'"gpt-4o-mini"', json.dumps(VLLM_MODEL).encode())


def test_client_key_reaches_primary_only(
    make_proxy: ProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url, vllm_url=upstream.url, rollout="{mode: shadow, shadow_sample: 1.0}"
    )
    headers = {
        "Authorization": "Bearer sk-client-hosted-key",
        "OpenAI-Organization": "org-1",
        "api-key": "azure-style-key",
        "Connection": "keep-alive, X-Secret-Hop",
        "X-Secret-Hop": "1",
        "Proxy-Authorization": "Basic abc",
        "TE": "trailers",
        "X-Custom-Trace": "t-1",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "Content-Type": "application/json",
    }
    post(proxy.url, BODY, headers)
    wait_for_both(seen)
    primary = next(r for r in seen if b'"gpt-4o-mini"' in r.body)
    shadow = next(r for r in seen if VLLM_MODEL.encode() in r.body)
    assert primary.headers["Authorization"] == "Bearer sk-client-hosted-key"
    assert primary.headers["OpenAI-Organization"] == "org-1"
    for name in ("Authorization", "api-key", "OpenAI-Organization", "Cookie"):
        assert name not in shadow.headers, f"{name} leaked to the candidate"
    assert "sk-client-hosted-key" not in json.dumps(shadow.headers)
    for recorded in (primary, shadow):
        assert "Proxy-Authorization" not in recorded.headers
        assert "TE" not in recorded.headers
        assert "X-Secret-Hop" not in recorded.headers
        assert recorded.headers["traceparent"] == headers["traceparent"]
    # The candidate gets an allowlist of the client's headers (issue 21): an unknown header
    # may be anyone's credential.
    assert primary.headers["X-Custom-Trace"] == "t-1"
    assert "X-Custom-Trace" not in shadow.headers


def test_configured_backend_keys_replace_client_keys(
    make_proxy: ProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url,
        vllm_url=upstream.url,
        rollout="{mode: shadow, shadow_sample: 1.0}",
        hosted_extra=", api_key: sk-org-hosted",
        vllm_extra=", api_key: vllm-key",
    )
    post(proxy.url, BODY, {"Authorization": "Bearer sk-client", "Content-Type": "application/json"})
    wait_for_both(seen)
    by_model = {b'"gpt-4o-mini"' in r.body: r.headers["Authorization"] for r in seen}
    assert by_model == {True: "Bearer sk-org-hosted", False: "Bearer vllm-key"}


def test_master_key_is_never_forwarded(
    make_proxy: ProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url, vllm_url=upstream.url, extra="server: {master_key: sk-master}"
    )
    response = post(proxy.url, BODY, {"Authorization": "Bearer sk-master"})
    assert response.status == 200
    assert all("sk-master" not in json.dumps(r.headers) for r in seen)


def test_response_headers(
    make_proxy: ProxyFactory, recording_upstream: tuple[BackgroundServer, list[Recorded]]
) -> None:
    upstream, _ = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    response = post(proxy.url, BODY, {})
    assert response.getheader("x-kvmigrate-upstream-request-id") == "upstream-id-1"
    assert response.getheader("x-request-id", "").startswith("req_")
    assert response.getheader("x-kvmigrate-backend") == "hosted"


def test_split_sends_the_candidates_model_name(make_proxy: ProxyFactory) -> None:
    completion = (
        make_proxy(rollout="{mode: split, percent: 100}")
        .client()
        .chat.completions.create(model=HOSTED_MODEL, messages=[{"role": "user", "content": "x"}])
    )
    assert completion.model == VLLM_MODEL  # the vLLM emulator echoes what it served


def test_the_candidate_gets_no_credential_of_any_shape(
    make_proxy: ProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
) -> None:
    """Vendor key headers and keys in the query string never reach the candidate."""
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url, vllm_url=upstream.url, rollout="{mode: shadow, shadow_sample: 1.0}"
    )
    secrets = {
        "x-goog-api-key": "goog-SECRET-1",
        "anthropic-api-key": "anth-SECRET-2",
        "Ocp-Apim-Subscription-Key": "apim-SECRET-3",
        "X-Auth-Token": "tok-SECRET-4",
    }
    host, port = proxy.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request(
        "POST",
        "/v1/chat/completions?api-key=query-SECRET-5&key=query-SECRET-6&trace=keep",
        body=BODY,
        headers={**secrets, "Content-Type": "application/json"},
    )
    assert conn.getresponse().status == 200
    conn.close()
    wait_for_both(seen)
    primary = next(r for r in seen if b'"gpt-4o-mini"' in r.body)
    shadow = next(r for r in seen if VLLM_MODEL.encode() in r.body)
    assert "SECRET" not in json.dumps(shadow.headers) + shadow.path
    assert shadow.path.endswith("?trace=keep")
    # The client's own credentials still reach the primary, which they are meant for.
    assert "query-SECRET-5" in primary.path
    assert primary.headers["x-goog-api-key"] == "goog-SECRET-1"
