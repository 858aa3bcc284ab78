"""The answer's bytes on the client's connection (kvmigrate.proxy.client_answer): framing
for HTTP/1.1 and HTTP/1.0 clients, keep-alive and `Connection: close`, and answers that
have no body (HEAD, 204), read by `http.client` and raw sockets that see every byte."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from proxy_support import HOSTED_MODEL, Backends, ProxyFactory, RunningProxy

from kvmigrate.proxy.client import InvalidHeader
from kvmigrate.proxy.client_answer import ClientAnswer
from kvmigrate.serving import BackgroundServer

FILE = {"id": "file-1", "object": "file", "bytes": 12}


def _files_app() -> web.Application:
    """A primary whose file routes answer with a body, with a HEAD, and with a 204."""

    async def get_file(request: web.Request) -> web.Response:
        return web.json_response(FILE)

    async def delete_file(request: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application()
    app.router.add_get("/v1/files/file-1", get_file)  # aiohttp answers HEAD from it too
    app.router.add_delete("/v1/files/file-1", delete_file)
    return app


@pytest.fixture(scope="module")
def files() -> Iterator[BackgroundServer]:
    with BackgroundServer(_files_app) as server:
        yield server


def _address(proxy: RunningProxy) -> tuple[str, int]:
    url = urlsplit(proxy.url)
    assert url.hostname is not None
    assert url.port is not None
    return url.hostname, url.port


def _connection(proxy: RunningProxy) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(*_address(proxy), timeout=10)


def _chat(stream: bool) -> bytes:
    return json.dumps(
        {"model": HOSTED_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()


HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-client"}


def test_one_connection_carries_whole_and_streamed_answers_in_turn(
    make_proxy: ProxyFactory,
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 0}")
    conn = _connection(proxy)
    seen = []
    for stream in (False, True, False, True):
        conn.request("POST", "/v1/chat/completions", _chat(stream), HEADERS)
        answer = conn.getresponse()
        body = answer.read()
        assert answer.status == 200
        seen.append(conn.sock)
        if stream:
            assert answer.getheader("Transfer-Encoding") == "chunked"
            assert answer.getheader("Content-Length") is None
            assert body.rstrip().endswith(b"data: [DONE]")
        else:
            assert answer.getheader("Content-Length") == str(len(body))
            assert json.loads(body)["object"] == "chat.completion"
        assert answer.getheader("x-kvmigrate-backend") == "hosted"
        assert answer.getheader("Date")
        assert answer.getheader("Connection") is None  # HTTP/1.1: open by default
    assert all(sock is seen[0] for sock in seen)  # never closed between answers
    conn.close()


def _raw_exchange(proxy: RunningProxy, request: bytes) -> bytes:
    """Everything the proxy sends back until it closes the connection."""
    with socket.create_connection(_address(proxy), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def _post(version: str, body: bytes, connection: str = "") -> bytes:
    head = (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: proxy\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer sk-client\r\n"
        f"Content-Length: {len(body)}\r\n{connection}\r\n"
    )
    return head.encode() + body


def test_an_http_1_0_client_gets_its_stream_unchunked_and_the_connection_closed(
    make_proxy: ProxyFactory,
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 0}")
    received = _raw_exchange(proxy, _post("1.0", _chat(True)))
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK\r\n")
    assert b"transfer-encoding" not in head.lower()  # HTTP/1.0 has no chunked coding
    assert body.startswith(b"data: ")  # the events themselves, no chunk sizes between
    assert body.rstrip().endswith(b"data: [DONE]")


def test_an_http_1_0_client_asking_to_keep_alive_gets_a_whole_answer_and_an_open_connection(
    make_proxy: ProxyFactory,
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 0}")
    request = _post("1.0", _chat(False), "Connection: keep-alive\r\n")
    with socket.create_connection(_address(proxy), timeout=10) as sock:
        for _ in range(2):  # the second answer comes on the same connection
            sock.sendall(request)
            received = b""
            while b"\r\n\r\n" not in received:
                received += sock.recv(65536)
            head, _, body = received.partition(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
            )
            while len(body) < length:
                body += sock.recv(65536)
            assert head.startswith(b"HTTP/1.0 200 OK\r\n")
            assert b"\r\nConnection: keep-alive" in head
            assert json.loads(body)["object"] == "chat.completion"


def test_connection_close_from_the_client_is_answered_and_honoured(
    make_proxy: ProxyFactory,
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 0}")
    for stream in (False, True):
        received = _raw_exchange(proxy, _post("1.1", _chat(stream), "Connection: close\r\n"))
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"\r\nConnection: close" in head
        if stream:  # a chunked body still ends with its last chunk before the close
            assert body.endswith(b"\r\n0\r\n\r\n")


def test_a_head_and_a_204_have_no_body_and_the_connection_goes_on(
    backends: Backends, make_proxy: ProxyFactory, files: BackgroundServer
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 0}", hosted_url=files.url)
    conn = _connection(proxy)
    conn.request("HEAD", "/v1/files/file-1", headers=HEADERS)
    head = conn.getresponse()
    assert head.status == 200
    assert head.read() == b""
    conn.request("DELETE", "/v1/files/file-1", headers=HEADERS)
    deleted = conn.getresponse()
    assert deleted.status == 204
    assert deleted.read() == b""
    assert deleted.getheader("Content-Length") is None
    assert deleted.getheader("Transfer-Encoding") is None
    sock = conn.sock
    conn.request("GET", "/v1/files/file-1", headers=HEADERS)
    got = conn.getresponse()
    assert got.status == 200
    assert json.loads(got.read()) == FILE
    assert conn.sock is sock  # a stray body byte would have broken this third answer
    conn.close()


def test_a_header_value_with_a_line_break_is_refused_before_any_byte_goes_out() -> None:
    request = make_mocked_request("POST", "/v1/chat/completions")
    answer = ClientAnswer(request, 200, [("x-note", "one\r\nx-injected: two")])
    with pytest.raises(InvalidHeader, match="line break"):
        asyncio.run(answer.send_whole(b"{}"))
    assert request.transport is not None
    assert not request.transport.write.called  # type: ignore[attr-defined]


EVENT = b"data: " + b"x" * (64 * 1024 - 8) + b"\n\n"  # 64 KiB per event
EVENTS = 1024  # 64 MiB: far more than every socket and transport buffer on the way holds


class Firehose:
    """A primary that streams as fast as the connection takes it, counting what it wrote."""

    def __init__(self) -> None:
        self.written = 0

    def app(self) -> web.Application:
        async def stream(request: web.Request) -> web.StreamResponse:
            await request.read()
            answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await answer.prepare(request)
            for _ in range(EVENTS):
                await answer.write(EVENT)  # waits while the connection's buffer is full
                self.written += len(EVENT)
            await answer.write_eof()
            return answer

        app = web.Application()
        app.router.add_post("/v1/chat/completions", stream)
        return app


def _read_chunked(sock: socket.socket) -> bytes:
    """The body of one chunked answer, its head skipped, read to its last chunk."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(1 << 20)
    buffer = buffer.partition(b"\r\n\r\n")[2]
    body = bytearray()
    while True:
        while b"\r\n" not in buffer:
            buffer += sock.recv(1 << 20)
        size_line, _, buffer = buffer.partition(b"\r\n")
        size = int(size_line, 16)
        while len(buffer) < size + 2:
            buffer += sock.recv(1 << 20)
        body += buffer[:size]
        buffer = buffer[size + 2 :]
        if size == 0:
            return bytes(body)


def test_a_client_that_stops_reading_holds_the_upstream_back_and_loses_nothing(
    make_proxy: ProxyFactory,
) -> None:
    firehose = Firehose()
    with BackgroundServer(firehose.app) as upstream:
        # No noise copy: the firehose counts the client's answer alone.
        rollout = "{mode: split, percent: 0, noise_sample: 0}"
        proxy = make_proxy(rollout=rollout, hosted_url=upstream.url)
        with socket.create_connection(_address(proxy), timeout=30) as sock:
            sock.sendall(_post("1.1", _chat(True)))
            # Not reading: once every buffer between is full the firehose must stop.
            deadline, seen = time.monotonic() + 20, -1
            while firehose.written != seen and time.monotonic() < deadline:
                seen = firehose.written
                time.sleep(0.5)
            assert firehose.written == seen  # it stopped
            assert firehose.written < EVENTS * len(EVENT) // 2  # well before the end
            body = _read_chunked(sock)
    assert body == EVENT * EVENTS  # every byte, in order, once the client reads again
