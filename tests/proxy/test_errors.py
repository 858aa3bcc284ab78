"""Every error leaves the proxy as an OpenAI envelope with the right status."""

from __future__ import annotations

import http.client
import json
import socket

import openai
import pytest
from proxy_support import HOSTED_MODEL, ProxyFactory, Recorded

from kvmigrate.serving import BackgroundServer, free_port

USER = [{"role": "user", "content": "hello"}]


def raw_post(
    url: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, object]]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(
            "POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})}
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[]", 400, "JSON object"),
        (b'{"messages": []}', 400, "model"),
        (b'{"model": "gpt-4o-mini", "stream": "yes", "messages": []}', 400, "stream"),
        (b'{"model": "no-such-model", "messages": []}', 404, "does not exist"),
        (b"", 400, "empty"),
    ],
)
def test_malformed_requests_get_envelopes_and_are_not_forwarded(
    make_proxy: ProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
    body: bytes,
    status: int,
    fragment: str,
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    got, envelope = raw_post(proxy.url, "/v1/chat/completions", body)
    assert got == status
    error = envelope["error"]
    assert isinstance(error, dict)
    assert fragment in error["message"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert seen == []


def test_sdk_maps_unknown_model_to_not_found(make_proxy: ProxyFactory) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        make_proxy().client().chat.completions.create(model="nope", messages=USER)
    assert caught.value.code == "model_not_found"


def test_body_over_limit_is_413(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(extra="server: {max_body_bytes: 2048}")
    big = [{"role": "user", "content": "x" * 4096}]
    with pytest.raises(openai.APIStatusError) as caught:
        proxy.client().chat.completions.create(model=HOSTED_MODEL, messages=big)
    assert caught.value.status_code == 413
    status, _envelope = raw_post(proxy.url, "/v1/chat/completions", b"{" + b" " * 5000 + b"}")
    assert status == 413


def test_master_key_required_and_checked(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(extra="server: {master_key: sk-proxy-master}")
    with pytest.raises(openai.AuthenticationError):
        proxy.client(api_key="sk-wrong").chat.completions.create(model=HOSTED_MODEL, messages=USER)
    status, _envelope = raw_post(
        proxy.url,
        "/v1/chat/completions",
        json.dumps({"model": HOSTED_MODEL, "messages": USER}).encode(),
    )
    assert status == 401
    with pytest.raises(openai.AuthenticationError):
        proxy.client(api_key="sk-wrong").models.list()
    ok = proxy.client(api_key="sk-proxy-master").chat.completions.create(
        model=HOSTED_MODEL, messages=USER
    )
    assert ok.choices[0].message.content


def test_unreachable_backend_is_502(make_proxy: ProxyFactory) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening
        proxy = make_proxy(hosted_url=dead)
        with pytest.raises(openai.APIStatusError) as caught:
            proxy.client().chat.completions.create(model=HOSTED_MODEL, messages=USER)
    assert caught.value.status_code == 502
    assert caught.value.code == "upstream_unreachable"


def test_backend_timeout_is_504(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(hosted_read_timeout=0.3)
    with pytest.raises(openai.APIStatusError) as caught:
        proxy.client().chat.completions.create(
            model=HOSTED_MODEL, messages=USER, extra_headers={"x-emulator-fault": "hang"}
        )
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"


@pytest.mark.parametrize(
    ("fault", "error_type"),
    [
        ("429", openai.RateLimitError),
        ("503", openai.InternalServerError),
    ],
)
def test_backend_errors_pass_through(
    make_proxy: ProxyFactory, fault: str, error_type: type[openai.APIStatusError]
) -> None:
    proxy = make_proxy()
    with pytest.raises(error_type) as caught:
        proxy.client().chat.completions.create(
            model=HOSTED_MODEL, messages=USER, extra_headers={"x-emulator-fault": fault}
        )
    assert caught.value.status_code == int(fault)
    assert caught.value.response.headers["x-kvmigrate-backend"] == "hosted"
    if fault == "429":
        assert caught.value.response.headers.get("retry-after")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/../admin",
        "/v1/files/..%2F..%2Fetc",
        "/v1//evil.example.com/x",
        "/v1/a/%2e%2e/b",
        "/v1/x@evil.example.com/y",
    ],
)
def test_path_tricks_never_leave_the_configured_base(
    make_proxy: ProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
    path: str,
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    status, envelope = raw_post(proxy.url, path, b"{}")
    assert status in (400, 404)
    assert "error" in envelope
    assert all(r.path.startswith("/v1/") and ".." not in r.path for r in seen)


def test_other_v1_paths_pass_through_to_primary(
    make_proxy: ProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=f"http://127.0.0.1:{free_port()}")
    status, _ = raw_post(proxy.url, "/v1/moderations?x=1", b'{"input": "hi"}')
    assert status == 200
    assert seen[-1].path == "/v1/moderations?x=1"
    assert seen[-1].body == b'{"input": "hi"}'


@pytest.mark.parametrize("percent", [0, 100])
def test_the_candidates_context_length_error_reads_like_the_primarys(
    make_proxy: ProxyFactory, percent: int
) -> None:
    """An agent that summarises its history on `context_length_exceeded` must keep doing so
    when vLLM answers: the same SDK exception, code and param from either backend. (With a
    fallback, the primary would be asked instead: see the fault matrix's refusal cells.)"""
    rollout = f"{{mode: split, percent: {percent}, shadow_sample: 0, fallback: false}}"
    proxy = make_proxy(rollout=rollout)
    client = proxy.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.with_raw_response.create(
            model=HOSTED_MODEL,
            messages=[{"role": "user", "content": "x " * 200_000}],
            max_tokens=16,
        )
    error = caught.value
    assert error.response.headers["x-kvmigrate-backend"] == ("vllm" if percent else "hosted")
    assert (error.code, error.param, error.type) == (
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
    )
    assert "maximum context length" in error.message


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"model": "%s", "messages": []}', 404),
        (b'{"model": "gpt-4o-mini", "%s": 1, "%s": 2, "model": "gpt-4o-mini"}', 400),
    ],
)
def test_an_error_names_a_clients_value_cut_short(
    make_proxy: ProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
    body: bytes,
    status: int,
) -> None:
    # Before: a 100 KB model name (or repeated key) came back whole in the error message.
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    name = b"m\\u001b" + b"x" * 100_000
    got, envelope = raw_post(proxy.url, "/v1/chat/completions", body.replace(b"%s", name))
    assert got == status
    error = envelope["error"]
    assert isinstance(error, dict)
    message = str(error["message"])
    assert "m\\x1bxxx" in message  # named, escaped
    assert len(message) < 600
    assert error["param"] is None or len(str(error["param"])) < 300
    assert seen == []
