"""The proxy's upstream HTTP/1.1 client against real loopback servers that write exact
bytes: framing (Content-Length, chunked with extensions and trailers, read to close),
interim answers, keep-alive reuse and when a connection must not be reused, a server that
drops an idle connection, timeouts, limits, a slow consumer, TLS, and what a bad answer or a
bad header raises."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ssl
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tls_support import make_certificate, serving_context

from kvmigrate.proxy.client import (
    ConnectFailed,
    ConnectTimeout,
    HttpClient,
    InvalidHeader,
    ProtocolViolation,
    ReadTimeout,
    ServerDisconnected,
)
from kvmigrate.proxy.client.connection import HIGH_WATER

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Scripted"], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class Scripted:
    """A server that answers each connection with a script, counting connections and
    keeping each request head it read."""

    port: int = 0
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    heads: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                await reader.readexactly(int(line.split(b":")[1]))
        return head


@contextlib.asynccontextmanager
async def scripted(script: Script, tls: ssl.SSLContext | None = None) -> AsyncIterator[Scripted]:
    state = Scripted()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        state.open_now += 1
        state.most_open = max(state.most_open, state.open_now)
        try:
            await script(reader, writer, state)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            state.open_now -= 1
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()


async def keep_alive(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
) -> None:
    while True:
        await state.read_request(reader)
        writer.write(OK)
        await writer.drain()


async def one_answer_per_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
) -> None:
    """Answer the first call, then read the next and close unanswered: a server that timed
    its idle keep-alive connection out just as the client reused it."""
    await state.read_request(reader)
    writer.write(OK)
    await writer.drain()
    await state.read_request(reader)


def answer_once(answer: bytes, then_wait: float = 0.0) -> Script:
    """Read one request, write `answer`, wait `then_wait` seconds, close."""

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        await state.read_request(reader)
        if answer:
            writer.write(answer)
            await writer.drain()
        await asyncio.sleep(then_wait)

    return script


def client(**kwargs: float) -> HttpClient:
    settings: dict[str, float] = {"max_connections": 100, "connect_timeout": 2, "read_timeout": 5}
    settings.update(kwargs)
    return HttpClient(
        max_connections=int(settings["max_connections"]),
        connect_timeout=settings["connect_timeout"],
        read_timeout=settings["read_timeout"],
    )


async def fetch(http: HttpClient, url: str, method: str = "POST") -> tuple[int, bytes]:
    response = await http.request(method, url + "/v1/chat/completions", {"A": "b"}, b"{}")
    return response.status, await response.read()


def test_calls_reuse_one_keep_alive_connection() -> None:
    async def main() -> None:
        async with scripted(keep_alive) as server:
            http = client()
            for _ in range(5):
                assert await fetch(http, server.url) == (200, b"{}")
            await http.close()
        assert server.connections == 1
        first = server.heads[0].decode()
        assert first.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{server.port}\r\n" in first
        assert "Content-Length: 2\r\n" in first
        assert "A: b\r\n" in first

    asyncio.run(main())


@pytest.mark.parametrize(
    ("answer", "body", "reused"),
    [
        # chunk extensions and trailers: the body only, trailers dropped
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
            b"hello world",
            True,
        ),
        # an interim 103 before the answer
        (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK, b"{}", True),
        # a body delimited by the end of the connection
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
            b"until the end",
            False,
        ),
        # the server says it will close
        (
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc",
            b"abc",
            False,
        ),
        # HTTP/1.0 without keep-alive
        (b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc", b"abc", False),
        # bytes after the answer: the connection is out of step
        (OK + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"{}", False),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b"", True),
    ],
)
def test_framings(answer: bytes, body: bytes, reused: bool) -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        while True:
            await state.read_request(reader)
            writer.write(answer)
            await writer.drain()
            if b"Connection: close" in answer or b"until the end" in answer:
                return

    async def main() -> None:
        async with scripted(script) as server:
            http = client()
            status = 204 if answer.startswith(b"HTTP/1.1 204") else 200
            assert await fetch(http, server.url) == (status, body)
            await fetch(http, server.url)
            await http.close()
        assert server.connections == (1 if reused else 2)

    asyncio.run(main())


def test_an_interim_answers_headers_are_not_the_answers() -> None:
    script = answer_once(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK)

    async def main() -> None:
        async with scripted(script) as server:
            http = client()
            response = await http.request("GET", server.url + "/v1/models", {})
            assert "link" not in response.headers
            assert response.headers["content-type"] == "application/json"
            assert response.content_length == 2
            response.close()
            await http.close()

    asyncio.run(main())


def test_a_keep_alive_connection_the_server_dropped_is_replaced_once() -> None:
    """The server answers with keep-alive, then closes the idle connection: the next call
    goes out on a new connection without the caller seeing the drop."""

    script = answer_once(OK)

    async def main() -> None:
        async with scripted(script) as server:
            http = client()
            for _ in range(3):
                assert await fetch(http, server.url) == (200, b"{}")
            await http.close()
        assert server.connections == 3

    asyncio.run(main())


def test_a_fresh_connection_closed_before_answering_fails() -> None:
    script = answer_once(b"")

    async def main() -> None:
        async with scripted(script) as server:
            http = client()
            with pytest.raises(ServerDisconnected, match="before answering"):
                await fetch(http, server.url)
            await http.close()
        assert server.connections == 1  # no retry: it was not a reused connection

    asyncio.run(main())


@pytest.mark.parametrize(
    ("answer", "error", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", ServerDisconnected, "while"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
            ServerDisconnected,
            "while",
        ),
        (b"SMTP ready\r\n\r\n", ProtocolViolation, "not valid HTTP"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            ProtocolViolation,
            "not valid HTTP",
        ),
        (
            b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n",
            ProtocolViolation,
            "over 65536 bytes",
        ),
        # one header that never ends
        (b"HTTP/1.1 200 OK\r\nX-Endless: " + b"a" * 70_000, ProtocolViolation, "over 65536 bytes"),
    ],
)
def test_broken_answers(answer: bytes, error: type[Exception], message: str) -> None:
    script = answer_once(answer)

    async def main() -> None:
        async with scripted(script) as server:
            http = client()
            with pytest.raises(error, match=message):
                await fetch(http, server.url)
            await http.close()

    asyncio.run(main())


def test_read_timeout_counts_silence_not_the_whole_answer() -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        await state.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(8):  # 0.8 s in all, never more than 0.1 s of silence
            await asyncio.sleep(0.1)
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
        await asyncio.sleep(30)  # then silence

    async def main() -> None:
        async with scripted(script) as server:
            http = client(read_timeout=1.0)  # 10x the gaps: a loaded machine stalls
            response = await http.request("POST", server.url + "/v1/x", {}, b"{}")
            received: list[bytes] = []

            async def read_all() -> None:
                async for chunk in response.iter_any():
                    received.append(chunk)

            with pytest.raises(ReadTimeout, match=r"sent nothing for 1 s"):
                await read_all()
            assert b"".join(received) == b"x" * 8
            response.close()
            await http.close()

    asyncio.run(main())


def test_connect_failures() -> None:
    async def silent(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        await asyncio.sleep(30)

    async def main() -> None:
        async with scripted(silent) as server:
            port = server.port
            http = client(connect_timeout=0.3)
            # TLS to a server that never answers the handshake: the connect timeout.
            with pytest.raises(ConnectTimeout, match=r"within 0\.3 s"):
                await fetch(http, f"https://127.0.0.1:{port}")
            await http.close()
        http = client()
        with pytest.raises(ConnectFailed, match=f"cannot connect to 127.0.0.1:{port}"):
            await fetch(http, f"http://127.0.0.1:{port}")
        await http.close()

    asyncio.run(main())


def test_at_most_max_connections_are_open_and_the_rest_wait() -> None:
    async def slow(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        while True:
            await state.read_request(reader)
            await asyncio.sleep(0.05)
            writer.write(OK)
            await writer.drain()

    async def main() -> None:
        async with scripted(slow) as server:
            http = client(max_connections=2)
            answers = await asyncio.gather(*(fetch(http, server.url) for _ in range(8)))
            await http.close()
        assert answers == [(200, b"{}")] * 8
        assert server.most_open == 2

    asyncio.run(main())


def test_an_answer_closed_unread_takes_its_connection_with_it() -> None:
    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        while True:
            await state.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"cde")
            await writer.drain()

    async def main() -> None:
        async with scripted(script) as server:
            http = client()
            response = await http.request("POST", server.url + "/v1/x", {}, b"{}")
            response.close()  # the client left before the body came
            assert await fetch(http, server.url) == (200, b"abcde")
            await http.close()
        assert server.connections == 2

    asyncio.run(main())


def test_an_answer_dropped_unclosed_gives_its_slot_back() -> None:
    """A code path that forgets to close an answer must not hold its connection slot for
    good: with one slot, the next call would wait forever."""

    async def main() -> None:
        async with scripted(keep_alive) as server:
            http = client(max_connections=1)
            response = await http.request("POST", server.url + "/v1/x", {}, b"{}")
            assert response.status == 200
            del response
            gc.collect()
            assert await asyncio.wait_for(fetch(http, server.url), 5) == (200, b"{}")
            await http.close()

    asyncio.run(main())


def test_a_closed_answer_dies_by_reference_count() -> None:
    """Every upstream call makes an answer: one that only the cyclic collector can free
    makes the proxy's young collections find and scan every call's objects under load."""

    async def main() -> None:
        async with scripted(keep_alive) as server:
            http = client()
            gc.disable()
            try:
                for read_whole in (True, False):
                    response = await http.request("POST", server.url + "/v1/x", {}, b"{}")
                    if read_whole:
                        assert await response.read() == b"{}"
                    else:
                        response.close()
                    answer = weakref.ref(response)
                    del response
                    assert answer() is None, "an answer outlived its last reference"
            finally:
                gc.enable()
            await http.close()

    asyncio.run(main())


def test_a_slow_consumer_pauses_the_upstream() -> None:
    """Nobody reads the answer: the client stops reading the socket past HIGH_WATER, so the
    server's writes back up instead of the proxy buffering the whole body."""
    total = 64 * HIGH_WATER
    finished = asyncio.Event()

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        await state.read_request(reader)
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n".encode())
        for _ in range(64):
            writer.write(b"z" * HIGH_WATER)
            await writer.drain()
        finished.set()

    async def main() -> None:
        async with scripted(script) as server:
            http = client()
            response = await http.request("POST", server.url + "/v1/x", {}, b"{}")
            await asyncio.sleep(0.5)
            assert not finished.is_set(), "the whole body was buffered with nobody reading"
            assert len(await response.read()) == total
            assert finished.is_set()
            await http.close()

    asyncio.run(main())


def test_a_head_answer_ends_at_its_headers() -> None:
    script = answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", then_wait=30)

    async def main() -> None:
        async with scripted(script) as server:
            http = client(read_timeout=10)
            response = await http.request("HEAD", server.url + "/v1/x", {})
            assert (response.status, response.content_length) == (200, 100)
            assert await asyncio.wait_for(response.read(), 5) == b""
            await http.close()
        assert b"Content-Length" not in server.heads[0]

    asyncio.run(main())


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Evil": "a\r\nInjected: 1"},
        {"X-Evil": "a\nInjected: 1"},
        {"X-Evil\r\nInjected": "1"},
        {"X-Evil": "lone \ud800 surrogate"},
    ],
)
def test_a_header_that_would_break_framing_is_refused_before_sending(
    headers: dict[str, str],
) -> None:
    async def main() -> None:
        async with scripted(keep_alive) as server:
            http = client()
            with pytest.raises(InvalidHeader):
                await http.request("POST", server.url + "/v1/x", headers, b"{}")
            assert await fetch(http, server.url) == (200, b"{}")  # the slot was given back
            await http.close()
        assert all(b"Injected" not in head for head in server.heads)

    asyncio.run(main())


def test_upstream_header_bytes_that_are_not_utf8_still_read() -> None:
    script = answer_once(b"HTTP/1.1 200 OK\r\nX-Name: caf\xe9\r\nX-Utf: caf\xc3\xa9\r\n" + OK[17:])

    async def main() -> None:
        async with scripted(script) as server:
            http = client()
            response = await http.request("GET", server.url + "/v1/x", {})
            assert response.headers["x-name"] == "caf\u00e9"
            assert response.headers["x-utf"] == "caf\u00e9"
            response.close()
            await http.close()

    asyncio.run(main())


def test_a_target_with_raw_spaces_or_non_ascii_is_percent_encoded() -> None:
    async def main() -> None:
        async with scripted(keep_alive) as server:
            http = client()
            response = await http.request("GET", server.url + "/v1/files/a b/\u00e9?q=1 2", {})
            await response.read()
            await http.close()
        assert server.heads[0].startswith(b"GET /v1/files/a%20b/%C3%A9?q=1%202 HTTP/1.1\r\n")

    asyncio.run(main())


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_certificate(tmp_path_factory.mktemp("tls"))


def test_https_verifies_the_server_certificate(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    serving = serving_context(cert, key)

    async def main() -> None:
        async with scripted(keep_alive, tls=serving) as server:
            url = f"https://localhost:{server.port}"
            untrusting = client()  # the system's trust store knows no such certificate
            with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await fetch(untrusting, url)
            await untrusting.close()
            trusting = HttpClient(
                max_connections=10,
                connect_timeout=2,
                read_timeout=5,
                tls=ssl.create_default_context(cafile=str(cert)),
            )
            assert await fetch(trusting, url) == (200, b"{}")
            assert await fetch(trusting, url) == (200, b"{}")
            await trusting.close()
        assert server.connections == 1  # one kept alive (a refused handshake never reaches it)
        assert server.heads[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: localhost:{server.port}\r\n".encode() in server.heads[0]

    asyncio.run(main())


def test_send_now_sends_on_an_idle_connection_before_the_answer_is_awaited() -> None:
    """`send_now` writes the call at once, on a connection a call before left idle, and
    sends nothing when none is idle (the caller then takes `request`'s way)."""

    async def main() -> None:
        async with scripted(keep_alive) as server:
            http = client()
            url = server.url + "/v1/chat/completions"
            assert http.send_now("POST", url, {}, b"{}") is None
            assert server.heads == []
            assert await fetch(http, server.url) == (200, b"{}")
            sent = http.send_now("POST", url, {"A": "c"}, b"{}")
            assert sent is not None
            for _ in range(100):  # the server has the call while nobody waits for its answer
                if len(server.heads) == 2:
                    break
                await asyncio.sleep(0.01)
            assert b"A: c\r\n" in server.heads[1]
            response = await http.answer(sent)
            assert (response.status, await response.read()) == (200, b"{}")
            await http.close()
        assert server.connections == 1

    asyncio.run(main())


def test_a_call_sent_now_on_a_connection_the_server_drops_goes_again_once() -> None:
    """The server reads the next call on its kept-alive connection and closes it without
    an answer (it had timed the connection out): the call goes again on a new one."""

    async def main() -> None:
        async with scripted(one_answer_per_connection) as server:
            http = client()
            url = server.url + "/v1/chat/completions"
            assert await fetch(http, server.url) == (200, b"{}")
            sent = http.send_now("POST", url, {}, b"{}")
            assert sent is not None
            response = await http.answer(sent)
            assert (response.status, await response.read()) == (200, b"{}")
            await http.close()
        assert server.connections == 2

    asyncio.run(main())


def test_send_now_takes_a_slot_and_abandon_gives_it_back() -> None:
    """With every slot taken `send_now` sends nothing; a call sent now and abandoned
    frees its slot for the next call."""

    async def main() -> None:
        async with scripted(keep_alive) as server:
            http = client(max_connections=1)
            url = server.url + "/v1/chat/completions"
            assert await fetch(http, server.url) == (200, b"{}")
            sent = http.send_now("POST", url, {}, b"{}")
            assert sent is not None
            assert http.send_now("POST", url, {}, b"{}") is None  # its one slot is taken
            http.abandon(sent)
            assert await asyncio.wait_for(fetch(http, server.url), 5) == (200, b"{}")
            await http.close()

    asyncio.run(main())
