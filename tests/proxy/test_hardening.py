"""Regressions from the adversarial probe (issue 21): what a hostile or broken peer sends."""

from __future__ import annotations

import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from aiohttp import web
from proxy_support import CHAT_BODY, HOSTED_MODEL, ProxyFactory, Recorded, send_raw, status_of

from kvmigrate.serving import BackgroundServer

CHAT = CHAT_BODY


def raw_request(url: str, path: str, headers: list[bytes], body: bytes = CHAT) -> bytes:
    return send_raw(url, b"POST " + path.encode() + b" HTTP/1.1", headers, body)


@pytest.mark.parametrize(
    "header",
    [
        b"Authorization: Bearer caf\xe9",
        b"api-key: caf\xe9",
        b"x-api-key: caf\xe9",
        b"Authorization: Bearer sk-master\xff",
    ],
)
def test_a_credential_that_is_not_utf8_is_a_401_without_a_traceback(
    make_proxy: ProxyFactory, header: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = make_proxy(extra="server: {master_key: sk-master}")
    with caplog.at_level(logging.ERROR):
        response = raw_request(proxy.url, "/v1/chat/completions", [header])
    assert status_of(response) == 401, response[:300]
    assert b'"invalid_api_key"' in response
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_session_id_that_is_not_utf8_is_served(
    make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 50}")
    with caplog.at_level(logging.ERROR):
        response = raw_request(proxy.url, "/v1/chat/completions", [b"X-Session-ID: caf\xe9"])
    assert status_of(response) == 200, response[:300]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.fixture
def truncating_upstream() -> Iterator[BackgroundServer]:
    """Answers `application/json` in chunks, then dies in the middle of the document."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": [')
        assert request.transport is not None
        request.transport.abort()
        return response

    def make() -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    with BackgroundServer(make) as server:
        yield server


@pytest.mark.parametrize(
    ("rollout", "broken"),
    [("{mode: shadow}", "hosted"), ("{mode: split, percent: 100, fallback: false}", "vllm")],
)
def test_a_json_answer_cut_off_midway_reaches_the_client_broken(
    make_proxy: ProxyFactory,
    truncating_upstream: BackgroundServer,
    backends: object,
    rollout: str,
    broken: str,
) -> None:
    urls = {f"{broken}_url": truncating_upstream.url}
    proxy = make_proxy(rollout=rollout, **urls)
    # Before the fix: a clean chunked 200 holding half a document.
    with pytest.raises(openai.APIConnectionError):
        proxy.client().chat.completions.create(
            model=HOSTED_MODEL, messages=[{"role": "user", "content": "hi"}]
        )


def test_a_body_with_two_models_is_refused_and_never_forwarded(
    make_proxy: ProxyFactory, recording_upstream: tuple[BackgroundServer, list[Recorded]]
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    body = (
        b'{"model": "gpt-4-32k-not-allowed", "messages": [{"role": "user", "content": "hi"}],'
        b' "model": "gpt-4o-mini"}'
    )
    response = raw_request(proxy.url, "/v1/chat/completions", [], body)
    assert status_of(response) == 400, response[:300]
    assert b"repeats the key `model`" in response
    assert seen == []


def test_logged_request_values_cannot_forge_log_lines() -> None:
    from kvmigrate.logtext import printable

    assert printable("/v1/x\r\nERROR forged line") == "/v1/x\\r\\nERROR forged line"
    assert printable("\x1b[2Jcaf\udce9") == "\\x1b[2Jcaf\\udce9"
    assert printable("ok path") == "ok path"
    assert len(printable("a" * 10_000)) < 400


@pytest.mark.parametrize(
    "header",
    [
        b"Authorization: Bearer sk-ECHOED-" + b"s" * 9000,
        b"Cookie: session=ECHOED-" + b"c" * 9000,
        b"X-Custom-Thing: ECHOED-" + b"x" * 9000,
        b"Authorization: Bearer sk-ECHOED-\x01\x02",
    ],
)
def test_a_malformed_header_is_never_echoed_or_logged(
    make_proxy: ProxyFactory, header: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = make_proxy()
    with caplog.at_level(logging.DEBUG):
        response = raw_request(proxy.url, "/v1/chat/completions", [header])
    assert 400 <= status_of(response) < 500, response[:300]
    assert b"application/json" in response
    assert b"ECHOED" not in response
    assert not [r for r in caplog.records if "ECHOED" in r.getMessage()]


def test_ready_probes_reuse_one_check_for_a_few_seconds(
    make_proxy: ProxyFactory, recording_upstream: tuple[BackgroundServer, list[Recorded]]
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url, vllm_url=upstream.url, hosted_extra=", api_key: sk-org"
    )
    for _ in range(20):
        with urllib.request.urlopen(proxy.url + "/ready", timeout=5) as response:
            assert response.status == 200
    probes = [r for r in seen if r.path.endswith("/models")]
    assert len(probes) == 2  # one check: the primary and the candidate, once each


def test_metrics_key_guards_metrics_and_health_stays_open(make_proxy: ProxyFactory) -> None:
    config = "server: {master_key: sk-master, metrics_key: metrics-secret}"
    proxy = make_proxy(extra=config)

    def get(path: str, key: str | None = None) -> int:
        request = urllib.request.Request(proxy.url + path)
        if key:
            request.add_header("Authorization", "Bearer " + key)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return error.code

    assert get("/metrics") == 401
    assert get("/metrics", "sk-master") == 401  # the clients' key is not the scraper's
    assert get("/metrics", "metrics-secret") == 200
    assert get("/health") == 200
    assert get("/ready") == 200


def _closed_by_peer(sock: socket.socket) -> bool:
    """True when the peer closes the connection before the socket's own timeout."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


LIMITS = "server: {header_timeout_seconds: 0.5, idle_timeout_seconds: 1, max_connections: 8}"


def test_a_connection_that_sends_no_request_head_is_closed(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(extra=LIMITS)
    host, port = proxy.url.removeprefix("http://").split(":")
    silent = socket.create_connection((host, int(port)), timeout=5)
    trickling = socket.create_connection((host, int(port)), timeout=5)
    trickling.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    with silent, trickling:
        assert _closed_by_peer(silent)
        assert _closed_by_peer(trickling)
    assert proxy.metric("kvmigrate_connections_closed_total", reason="header_timeout") >= 2


def test_an_idle_kept_alive_connection_is_closed(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(extra=LIMITS)
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        assert _closed_by_peer(sock)
    # An operator reads header_timeout as slow or hostile clients: a pool's idle
    # connection is neither.
    assert proxy.metric("kvmigrate_connections_closed_total", reason="idle") == 1
    assert proxy.metric("kvmigrate_connections_closed_total", reason="header_timeout") == 0


def test_connections_over_the_cap_are_closed_counted_and_logged(
    make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = make_proxy(extra="server: {max_connections: 8}")
    host, port = proxy.url.removeprefix("http://").split(":")
    with caplog.at_level(logging.WARNING):
        held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(12)]
        try:
            # Accepted in the order they connected: the last four are over the cap.
            assert all(_closed_by_peer(sock) for sock in held[8:])
            assert not any(_closed_by_peer_soon(sock) for sock in held[:8])
        finally:
            for sock in held:
                sock.close()
    assert any("max_connections" in r.getMessage() for r in caplog.records)
    # Released, the proxy serves again; the refusals are on /metrics.
    completion = proxy.client().chat.completions.create(
        model=HOSTED_MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.choices
    assert proxy.metric("kvmigrate_connections_closed_total", reason="over_limit") == 4


def _closed_by_peer_soon(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    return _closed_by_peer(sock)
