"""Fuzz the proxy's HTTP surface with hypothesis over raw sockets.

Every answer must be an OpenAI-style envelope with a status below 500, nothing malformed may
reach a backend, and the proxy's memory must stay flat. The proxy runs as a real process
(`kvmigrate proxy`) in front of a recording upstream.
"""

from __future__ import annotations

import collections
import gzip
import http.client
import json
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator

import orjson
import psutil
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvmigrate.serving import BackgroundServer, free_port

pytestmark = pytest.mark.timeout(600)

MODEL = "gpt-4o-mini"
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
TRICK_PATHS = [
    "/v1/../etc/passwd",
    "/v1/%2e%2e/admin",
    "/v1//evil.example.com/x",
    "/v1/files/..%2f..%2fx",
    "/v1/a/%2E%2E/b",
    "/v1/chat/completions/../../admin/rollout",
    "/admin/rollout",
    "/v1/models?x=%00",
    "//v1/chat/completions",
    "/v1/chat/completions%00",
    "/\\v1\\chat",
    "/v1/chat/completions?" + "q=" * 50,
    "/nope",
    "/metrics/../v1/x",
]
JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30)
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


# A request whose first message asks this upstream for a streamed tool call (its content:
# this marker, then a JSON object of `deltas`, `piece` (each delta: the piece `repeat` times)
# and `write`, the size of each write).
STREAM_ASK = b"fuzz-stream-tool-call"


def tool_call_events(deltas: int, piece: str) -> bytes:
    def event(delta: dict[str, object], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return b"data: " + orjson.dumps({"id": "c1", "model": MODEL, "choices": [choice]}) + b"\n\n"

    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "write"}}
    events = [event({"role": "assistant", "tool_calls": [head]})]
    events += [event({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})] * deltas
    return b"".join(events) + event({}, "tool_calls") + b"data: [DONE]\n\n"


async def stream_tool_call(request: web.Request, body: dict[str, object]) -> web.StreamResponse:
    """The tool call, written `write` bytes at a time: the proxy's reads end anywhere."""
    messages = body["messages"]
    assert isinstance(messages, list)
    spec = json.loads(messages[0]["content"].removeprefix(STREAM_ASK.decode()))
    events = tool_call_events(spec["deltas"], spec["piece"] * spec["repeat"])
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for start in range(0, len(events), spec["write"]):
        await response.write(events[start : start + spec["write"]])
    await response.write_eof()
    return response


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[BackgroundServer, list[bytes]]]:
    seen: list[bytes] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(body)
        if STREAM_ASK in body:
            return await stream_tool_call(request, orjson.loads(body))
        return web.json_response(
            {"id": "x", "object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 1}}
        )

    def make() -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    with BackgroundServer(make) as server:
        yield server, seen


@pytest.fixture(scope="module")
def proxy(
    upstream: tuple[BackgroundServer, list[bytes]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[int, psutil.Process]]:
    server, _ = upstream
    port = free_port()
    tmp = tmp_path_factory.mktemp("fuzz")
    config = tmp / "config.yaml"
    config.write_text(f"""
server: {{port: {port}, max_body_bytes: 65536, body_timeout_seconds: 1}}
backends:
  hosted: {{api_base: "{server.url}/v1"}}
  vllm: {{api_base: "{server.url}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: llama}}
rollout: {{mode: split, percent: 50, state: "sqlite:///{tmp}/state.db"}}
record: {{db: "sqlite:///{tmp}/records.db"}}
""")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvmigrate", "proxy", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, "proxy exited at start"
            assert time.monotonic() < deadline, "proxy did not start"
            time.sleep(0.05)
        yield port, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(15)
        assert proc.stdout is not None
        output = proc.stdout.read().decode()
        proc.stdout.close()
        assert "Traceback" not in output, output[-3000:]


def exchange(port: int, raw: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read one HTTP response (the proxy always sets Content-Length)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        while head.startswith(b"HTTP/1.1 100"):  # `Expect: 100-continue` first gets an interim
            while b"\r\n\r\n" not in body:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
            head, _, body = body.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
        }
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return status, headers, body


def request_bytes(method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    head = [
        f"{method} {path} HTTP/1.1".encode("latin-1", "replace"),
        b"Host: proxy",
        b"Connection: close",
        b"Content-Length: " + str(len(body)).encode(),
    ]
    head += [name + b": " + value for name, value in headers]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def chat_like() -> st.SearchStrategy[bytes]:
    field = st.sampled_from(
        [
            "model",
            "messages",
            "stream",
            "user",
            "tools",
            "max_tokens",
            "input",
            "stream_options",
            "response_format",
        ]
    )
    return st.dictionaries(field, JSON_VALUE, max_size=6).map(lambda d: json.dumps(d).encode())


BODIES = st.one_of(
    st.binary(max_size=300),  # arbitrary bytes, invalid UTF-8 included
    JSON_VALUE.map(lambda v: json.dumps(v).encode()),
    chat_like(),
    chat_like().map(lambda b: b[:-1] if len(b) > 2 else b),  # truncated JSON
    st.integers(10, 3000).map(lambda n: b"[" * n + b"]" * n),  # deep nesting
    st.integers(66_000, 90_000).map(lambda n: b'{"model": "x", "pad": "' + b"a" * n + b'"}'),
    st.just(orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})),
    st.just(b'{"model": "gpt-4o-mini", "messages": "\xff\xfe"}'),
)
HEADERS = st.lists(
    st.one_of(
        st.sampled_from(
            [
                (b"Content-Type", b"application/json"),
                (b"Content-Type", b"text/plain; charset=latin-1"),
                (b"Authorization", b"Bearer"),
                (b"Authorization", b"Basic \xff\xfe"),
                (b"X-Session-ID", "s\u00e9ss".encode()),
                (b"X-Session-ID", b""),
                (b"Transfer-Encoding", b"gzip"),
                (b"Expect", b"100-continue"),
                (b"X-Forwarded-Host", b"evil.example.com"),
                (b"Host", b"evil.example.com"),
                (b"x-emulator-fault", b"hang"),
                (b"Accept-Encoding", b"br, gzip"),
                # Credentials that are not UTF-8, or too long to parse (issue 21).
                (b"Authorization", b"Bearer caf\xe9"),
                (b"api-key", b"\xff\xfe-ECHO-api-key"),
                (b"x-api-key", b"k\xe9y-ECHO-x-api-key"),
                (b"Authorization", b"Bearer sk-ECHO-" + b"a" * 9000),
                (b"Cookie", b"session=ECHO-" + b"c" * 9000),
                (b"X-Session-ID", b"s\xe9ss-ECHO-session"),
            ]
        ),
        st.tuples(
            st.from_regex(rb"\A[A-Za-z][A-Za-z0-9-]{0,20}\Z"),
            st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
        ),
        st.just((b"X-Huge", b"v" * 9000)),
    ),
    max_size=4,
)


CREDENTIAL_NAMES = {b"authorization", b"api-key", b"x-api-key", b"cookie"}


def _raw_deflate(body: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(body) + packer.flush()


def _bomb(_body: bytes) -> bytes:
    """Past the fuzzed proxy's 64 KiB limit once inflated, a few hundred bytes as sent."""
    return gzip.compress(b'{"model": "gpt-4o-mini", "pad": "' + bytes(4 << 20) + b'"}')


# A body's Content-Encoding and what it does to the body: honest codings, codings the
# proxy refuses (415), bodies that do not match their coding, bombs.
CODINGS: list[tuple[bytes, Callable[[bytes], bytes]]] = [
    (b"gzip", gzip.compress),
    (b"x-gzip", gzip.compress),
    (b"deflate", zlib.compress),
    (b"deflate", _raw_deflate),
    (b"identity", bytes),
    (b"gzip", bytes),  # says gzip, is not
    (b"gzip", lambda b: gzip.compress(b)[:-5]),  # cut short
    (b"gzip", lambda b: gzip.compress(b) + b"\x00junk"),
    (b"gzip", _bomb),
    (b"deflate", lambda b: zlib.compress(bytes(1 << 22))),
    (b"gzip, gzip", lambda b: gzip.compress(gzip.compress(b))),
    (b"br", bytes),
    (b"zstd", bytes),
    (b"compress", bytes),
    (b"gzip;q=1", gzip.compress),
]


def check_envelope(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status < 500, (status, body[:300])
    if status >= 400:
        assert headers.get("content-type", "").startswith("application/json"), body[:200]
        error = json.loads(body)["error"]
        assert isinstance(error["message"], str)
        assert error["message"]
        assert "Traceback" not in error["message"]


@pytest.mark.slow
def test_fuzzed_requests_get_envelopes_and_nothing_malformed_is_forwarded(
    proxy: tuple[int, psutil.Process],
    upstream: tuple[BackgroundServer, list[bytes]],
) -> None:
    port, process = proxy
    _, forwarded = upstream
    statuses: collections.Counter[int] = collections.Counter()

    # Warm up, then take the baseline RSS.
    for _ in range(200):
        exchange(port, request_bytes("POST", ROUTES[0], [], b"{"))
    rss_before = process.memory_info().rss

    @settings(
        max_examples=5000,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        method=st.sampled_from(["POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS"]),
        path=st.one_of(
            st.sampled_from(ROUTES + TRICK_PATHS),
            st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=40).map(
                lambda p: "/v1/" + p
            ),
        ),
        headers=HEADERS,
        body=BODIES,
        coding=st.one_of(st.none(), st.sampled_from(CODINGS)),
    )
    def run(
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        coding: tuple[bytes, Callable[[bytes], bytes]] | None,
    ) -> None:
        if coding is not None:
            headers = [*headers, (b"Content-Encoding", coding[0])]
            body = coding[1](body)
        status, response_headers, response_body = exchange(
            port, request_bytes(method, path, headers, body)
        )
        statuses[status] += 1
        check_envelope(status, response_headers, response_body)
        # No header value comes back in an answer: it may be someone's credential.
        assert b"ECHO" not in response_body, response_body[:300]
        for name, value in headers:
            secret = value.removeprefix(b"Bearer ").removeprefix(b"Basic ")
            if (name.lower() in CREDENTIAL_NAMES or len(secret) > 100) and len(secret) >= 12:
                assert secret[:12] not in response_body, (value[:40], response_body[:300])

    run()
    total = sum(statuses.values())
    rss_after = process.memory_info().rss
    print(
        f"\nfuzz: {total} requests, statuses {dict(sorted(statuses.items()))}, "
        f"{len(forwarded)} forwarded, RSS {rss_before / 2**20:.1f} -> "
        f"{rss_after / 2**20:.1f} MiB"
    )
    assert total >= 5000
    for raw in forwarded:
        if raw:  # a GET passed through to the primary carries no body
            orjson.loads(raw)  # model routes forward objects; other routes valid JSON
    assert rss_after - rss_before < 40 * 2**20, "memory grew under fuzzing"


def test_slow_loris_body_times_out(proxy: tuple[int, psutil.Process]) -> None:
    port, _ = proxy
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b'Content-Length: 1000\r\nContent-Type: application/json\r\n\r\n{"mo'
        )
        start = time.monotonic()
        response = sock.recv(4096)
        elapsed = time.monotonic() - start
    assert response.startswith(b"HTTP/1.1 408")
    assert b'"request_timeout"' in response
    # The body timeout is 1 s (the config above), which is what this takes on a quiet
    # machine: 10 s is a 10x margin, and far below waiting for the 1000 bytes forever.
    assert elapsed < 10


def test_many_idle_connections_do_not_block_others(proxy: tuple[int, psutil.Process]) -> None:
    port, _ = proxy
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        status, _, _ = exchange(
            port,
            request_bytes("POST", ROUTES[0], [], orjson.dumps({"model": MODEL, "messages": []})),
        )
        assert status == 200
    finally:
        for sock in idle:
            sock.close()


def streamed_arguments(
    port: int, deltas: int, piece: str, write: int, repeat: int = 1
) -> list[str]:
    """A streamed tool call through the proxy (the primary or, split, the candidate: its
    stream is checked line by line), read whole; the argument deltas the client got."""
    spec = json.dumps({"deltas": deltas, "piece": piece, "write": write, "repeat": repeat})
    ask = [{"role": "user", "content": STREAM_ASK.decode() + spec}]
    body = orjson.dumps({"model": MODEL, "messages": ask, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", ROUTES[0], body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    assert response.status == 200, data[:300]
    assert data.endswith(b"data: [DONE]\n\n"), data[-300:]
    arguments = []
    for event in data.split(b"\n\n"):
        if not event.startswith(b"data: {"):
            continue
        for choice in orjson.loads(event[6:])["choices"]:
            for call in choice["delta"].get("tool_calls") or ():
                arguments.append(call.get("function", {}).get("arguments"))
    return [a for a in arguments if a]


def test_fuzzed_streamed_tool_calls_arrive_whole(proxy: tuple[int, psutil.Process]) -> None:
    port, _process = proxy

    @settings(max_examples=40, deadline=None, database=None, derandomize=True)
    @given(
        deltas=st.integers(1, 3000),
        piece=st.text(min_size=1, max_size=12),
        write=st.integers(1, 4096),
    )
    def run(deltas: int, piece: str, write: int) -> None:
        assert streamed_arguments(port, deltas, piece, write) == [piece] * deltas

    run()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("deltas", "piece", "repeat", "write"),
    [
        (100_000, '"ab\\n c\u00e9', 1, 4093),  # an agent writing a file: 100,000 deltas
        (1, "x", 2_000_000, 512),  # one 2 MB line arriving in 512-byte reads
    ],
    ids=["100k-deltas", "2MB-line"],
)
def test_very_long_streamed_tool_calls_arrive_whole_and_the_proxy_stays_small(
    proxy: tuple[int, psutil.Process], deltas: int, piece: str, repeat: int, write: int
) -> None:
    port, process = proxy
    rss_before = process.memory_info().rss
    for _ in range(2):  # the split sends one of them to each backend, most likely
        got = streamed_arguments(port, deltas, piece, write, repeat)
        assert got == [piece * repeat] * deltas
    status, _headers, _body = exchange(port, request_bytes("GET", "/health", [], b""))
    assert status == 200
    # What an exchange keeps of an answer is bounded (ChunkLog): not a stream's 25 MB.
    assert process.memory_info().rss - rss_before < 100 * 2**20
