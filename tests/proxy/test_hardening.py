"""Regressions from the adversarial probe (issue 21): what a hostile or broken peer sends."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import openai
import pytest
from aiohttp import web
from proxy_support import HOSTED_MODEL, ProxyFactory

from kvmigrate.serving import BackgroundServer

CHAT = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}'


def raw_request(url: str, path: str, headers: list[bytes], body: bytes = CHAT) -> bytes:
    """One request with headers exactly as given (bytes that are not UTF-8 included)."""
    host, port = url.removeprefix("http://").split(":")
    head = [
        b"POST " + path.encode() + b" HTTP/1.1",
        b"Host: proxy",
        b"Connection: close",
        b"Content-Type: application/json",
        b"Content-Length: " + str(len(body)).encode(),
        *headers,
    ]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


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
    make_proxy: ProxyFactory, recording_upstream: tuple[BackgroundServer, list[object]]
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
