"""Regressions from the second adversarial probe: paths that decode to a model route, bodies
nested too deeply to check, and bodies whose Content-Encoding does not match their bytes."""

from __future__ import annotations

import gzip
import logging
import socket

import orjson
import pytest
from proxy_support import CHAT_BODY, HOSTED_MODEL, ProxyFactory, Recorded, send_raw, status_of

from kvmigrate.serving import BackgroundServer

CHAT = CHAT_BODY
OPENING = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"x":'
Upstream = tuple[BackgroundServer, list[Recorded]]


def send(url: str, head: list[bytes], body: bytes = CHAT) -> bytes:
    """One request: its request line, then its headers, exactly as given."""
    return send_raw(url, head[0], head[1:], body)


def error_of(response: bytes) -> dict[str, object]:
    """The error object of either envelope (OpenAI's or Anthropic's)."""
    error = orjson.loads(response.partition(b"\r\n\r\n")[2])["error"]
    assert isinstance(error, dict)
    return error


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    "path",
    [
        b"/v1/chat%2Fcompletions",
        b"/v1/chat%2fcompletions",
        b"/v1/responses%2Fresp_1",
        b"/v1/messages%2Fcount_tokens",
        b"/v1/chat%5Ccompletions",
        b"/v1/x/%2e%2e/chat/completions",
        b"/v1/%2E%2E/v1/chat/completions",
        b"/v1/chat/completions/",
        b"/v1/Chat/Completions",
    ],
)
def test_a_path_disguising_a_model_route_is_refused_and_never_forwarded(
    make_proxy: ProxyFactory, recording_upstream: Upstream, path: bytes
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    # Before the fix: relayed to the primary's /v1/chat/completions as route "other",
    # past the allowlist, the duplicate-model check, the rollout and the records.
    body = b'{"model": "gpt-4-unlisted", "messages": [], "model": "gpt-4o-mini"}'
    response = send(proxy.url, [b"POST " + path + b" HTTP/1.1"], body)
    assert status_of(response) == 400, response[:300]
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    assert "Unsupported path" in str(error["message"])
    assert seen == []


def test_the_messages_routes_refuse_a_disguised_path_in_anthropics_envelope(
    make_proxy: ProxyFactory, recording_upstream: Upstream
) -> None:
    upstream, _seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    response = send(proxy.url, [b"POST /v1/messages%2Fcount_tokens HTTP/1.1"])
    assert status_of(response) == 400, response[:300]
    assert orjson.loads(response.partition(b"\r\n\r\n")[2])["type"] == "error"


@pytest.mark.parametrize(
    ("line", "forwarded"),
    [
        # A query may encode anything; only the path is checked.
        (b"GET /v1/chat/completions?after=a%2Fb HTTP/1.1", "/v1/chat/completions?after=a%2Fb"),
        (b"POST /v1/chat/completions/chatcmpl-1 HTTP/1.1", "/v1/chat/completions/chatcmpl-1"),
        (b"GET /v1/files/file-abc.1 HTTP/1.1", "/v1/files/file-abc.1"),
    ],
)
def test_plain_pass_through_paths_still_pass(
    make_proxy: ProxyFactory, recording_upstream: Upstream, line: bytes, forwarded: str
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    response = send(proxy.url, [line], b"{}" if line.startswith(b"POST") else b"")
    assert status_of(response) == 200, response[:300]
    assert [r.path for r in seen] == [forwarded]


# Within orjson's depth limit (1024), past Python's recursion limit (1000) wherever the
# stdlib parser starts from; the probe's proxy already failed at 974.
DEPTH = 1010
NESTED = [
    # `"model"` twice anywhere: the top level is parsed again to look for a repeated key.
    OPENING + b"[" * DEPTH + b'"model"' + b"]" * DEPTH + b"}",
    # A letter escaped as \u00XX: the same re-parse.
    OPENING + b"[" * DEPTH + b'"\\u0041"' + b"]" * DEPTH + b"}",
]


@pytest.mark.parametrize("route", ["chat/completions", "responses", "messages"])
@pytest.mark.parametrize("body", NESTED, ids=["model-twice", "escaped-letter"])
def test_a_body_nested_too_deeply_to_check_is_a_400_without_a_traceback(
    make_proxy: ProxyFactory,
    recording_upstream: Upstream,
    caplog: pytest.LogCaptureFixture,
    route: str,
    body: bytes,
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    with caplog.at_level(logging.ERROR):
        response = send(proxy.url, [f"POST /v1/{route} HTTP/1.1".encode()], body)
    # Before the fix: a 500 and a RecursionError traceback.
    assert status_of(response) == 400, response[:300]
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    assert "too deeply" in str(error["message"])
    assert seen == []
    assert not errors_logged(caplog)


@pytest.mark.parametrize("route", ["chat/completions", "messages", "files"])
@pytest.mark.parametrize("encoding", [b"deflate", b"gzip"])
def test_a_body_that_does_not_match_its_content_encoding_is_a_400(
    make_proxy: ProxyFactory,
    recording_upstream: Upstream,
    caplog: pytest.LogCaptureFixture,
    route: str,
    encoding: bytes,
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    head = [f"POST /v1/{route} HTTP/1.1".encode(), b"Content-Encoding: " + encoding]
    with caplog.at_level(logging.ERROR):
        response = send(proxy.url, head, b"abcde")
    # Before the fix: a 500, a traceback, and aiohttp's own "Unhandled exception".
    assert status_of(response) == 400, response[:300]
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    assert "could not be decoded" in str(error["message"])
    assert seen == []
    assert not errors_logged(caplog)
    # The worker still serves.
    completion = proxy.client().chat.completions.create(
        model=HOSTED_MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.choices


def test_a_gzipped_body_is_forwarded_decoded(
    make_proxy: ProxyFactory, recording_upstream: Upstream
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    head = [b"POST /v1/chat/completions HTTP/1.1", b"Content-Encoding: gzip"]
    response = send(proxy.url, head, gzip.compress(CHAT))
    assert status_of(response) == 200, response[:300]
    served = seen[0]
    assert orjson.loads(served.body)["model"] == HOSTED_MODEL
    assert "content-encoding" not in {name.lower() for name in served.headers}


def expect_continue(url: str, path: bytes, length: int, body: bytes) -> tuple[bytes, bytes]:
    """Headers with `Expect: 100-continue`, then (what came first, everything): the body is
    sent only when the first answer is `100 Continue`, as curl does."""
    host, port = url.removeprefix("http://").split(":")
    head = [
        b"POST " + path + b" HTTP/1.1",
        b"Host: proxy",
        b"Connection: close",
        b"Content-Type: application/json",
        b"Content-Length: %d" % length,
        b"Expect: 100-continue",
    ]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n")
        first = sock.recv(65536)
        if first.startswith(b"HTTP/1.1 100"):
            sock.sendall(body)
        data = first
        while not _answered(data):
            data += sock.recv(65536)
    return first, data


def _answered(data: bytes) -> bool:
    """Whether `data` holds a final answer whole (its body by Content-Length)."""
    if data.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"):
        data = data[len(b"HTTP/1.1 100 Continue\r\n\r\n") :]
    head, found, body = data.partition(b"\r\n\r\n")
    lengths = [line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
    return bool(found and lengths) and len(body) >= int(lengths[0].split(b":")[1])


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/messages", b"/v1/files"])
def test_an_oversized_body_announced_with_expect_is_refused_before_it_is_sent(
    make_proxy: ProxyFactory, recording_upstream: Upstream, path: bytes
) -> None:
    # Before: `100 Continue` first, so the client uploaded what the 413 then refused.
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url, vllm_url=upstream.url, extra="server: {max_body_bytes: 4096}"
    )
    first, whole = expect_continue(proxy.url, path, 10_000_000, b"")
    assert status_of(first) == 413, first[:300]
    assert b"connection: close" in whole.partition(b"\r\n\r\n")[0].lower()
    error = error_of(whole)
    assert error["type"] in ("invalid_request_error", "request_too_large")
    if path == b"/v1/messages":
        assert orjson.loads(whole.partition(b"\r\n\r\n")[2])["type"] == "error"
    assert seen == []


def test_a_body_within_the_limit_announced_with_expect_is_continued_and_served(
    make_proxy: ProxyFactory, recording_upstream: Upstream
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    first, whole = expect_continue(proxy.url, b"/v1/chat/completions", len(CHAT), CHAT)
    assert first.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert status_of(whole[len(b"HTTP/1.1 100 Continue\r\n\r\n") :]) == 200, whole[:300]
    assert orjson.loads(seen[0].body)["model"] == HOSTED_MODEL


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/messages"])
def test_an_expectation_other_than_continue_is_a_417_in_the_route_s_envelope(
    make_proxy: ProxyFactory, recording_upstream: Upstream, path: bytes
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(hosted_url=upstream.url, vllm_url=upstream.url)
    answer = send(proxy.url, [b"POST " + path + b" HTTP/1.1", b"Expect: bogus"])
    assert status_of(answer) == 417, answer[:300]
    assert b"application/json" in answer.partition(b"\r\n\r\n")[0].lower()
    assert "100-continue" in str(error_of(answer)["message"])
    if path == b"/v1/messages":
        assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["type"] == "error"
    assert seen == []


def send_chunked(url: str, body: bytes, piece: int = 1000) -> bytes:
    """A request whose body is sent chunked (no Content-Length), in pieces of `piece`."""
    host, port = url.removeprefix("http://").split(":")
    head = b"\r\n".join(
        [
            b"POST /v1/chat/completions HTTP/1.1",
            b"Host: proxy",
            b"Connection: close",
            b"Content-Type: application/json",
            b"Transfer-Encoding: chunked",
        ]
    )
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + piece]), body[i : i + piece])
        for i in range(0, len(body), piece)
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b"\r\n\r\n" + chunks + b"0\r\n\r\n")
        data = b""
        while not _answered(data):
            data += sock.recv(65536)
    return data


def test_a_chunked_body_is_read_whole_and_one_over_the_limit_is_a_413(
    make_proxy: ProxyFactory, recording_upstream: Upstream
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url, vllm_url=upstream.url, extra="server: {max_body_bytes: 8192}"
    )
    content = "a" * 5000
    body = orjson.dumps(
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]}
    )
    assert status_of(send_chunked(proxy.url, body)) == 200
    assert orjson.loads(seen[0].body)["messages"][0]["content"] == content
    big = body.replace(content.encode(), b"a" * 9000)
    response = send_chunked(proxy.url, big)
    assert status_of(response) == 413, response[:300]
    assert error_of(response)["code"] == "request_too_large"


def _body_of(size: int) -> bytes:
    """A chat request of exactly `size` bytes."""
    empty = orjson.dumps({"model": HOSTED_MODEL, "messages": [{"role": "user", "content": ""}]})
    return empty.replace(b'"content":""', b'"content":"' + b"a" * (size - len(empty)) + b'"')


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_of_exactly_the_limit_is_served_and_one_byte_more_is_a_413(
    make_proxy: ProxyFactory, recording_upstream: Upstream, chunked: bool
) -> None:
    upstream, seen = recording_upstream
    proxy = make_proxy(
        hosted_url=upstream.url, vllm_url=upstream.url, extra="server: {max_body_bytes: 8192}"
    )

    def post(body: bytes) -> bytes:
        if chunked:
            return send_chunked(proxy.url, body)
        return send(proxy.url, [b"POST /v1/chat/completions HTTP/1.1"], body)

    exact = _body_of(8192)
    assert len(exact) == 8192
    answer = post(exact)
    assert status_of(answer) == 200, answer[:300]

    def chats() -> list[bytes]:
        return [r.body for r in seen if r.path == "/v1/chat/completions"]

    assert chats() == [exact]
    answer = post(_body_of(8193))
    assert status_of(answer) == 413, answer[:300]
    assert error_of(answer)["code"] == "request_too_large"
    assert error_of(answer)["message"] == "Request body exceeds the limit of 8192 bytes."
    assert chats() == [exact]  # nothing more was forwarded
