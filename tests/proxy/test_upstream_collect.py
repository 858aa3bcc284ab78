"""An answer collected by its callbacks (a shadow copy's, `Response.collect`) against real
loopback servers: kept whole with nobody reading it, handed over once at its end, timed out
by the upstream's silence even with bytes buffered, and never handed over once closed."""

from __future__ import annotations

import asyncio
import time

from test_upstream_client import (
    OK,
    Script,
    Scripted,
    client,
    keep_alive,
    one_answer_per_connection,
    scripted,
)

from kvmigrate.proxy.client import HttpClient, ReadTimeout, Response, ServerDisconnected
from kvmigrate.proxy.client.connection import HIGH_WATER

URL_PATH = "/v1/chat/completions"


async def collect(http: HttpClient, url: str) -> tuple[Response, int, list[bytes]]:
    """Send a call on an idle connection and collect its answer; the count of hand-overs,
    and the body's parts as they were handed to the sink."""
    sent = http.send_now("POST", url + URL_PATH, {}, b"{}")
    assert sent is not None, "no idle connection: a call before must have left one"
    ended = asyncio.Event()
    calls: list[int] = []

    def done() -> None:
        calls.append(1)
        ended.set()

    parts: list[bytes] = []
    sent.response.collect(done, parts)
    await asyncio.wait_for(ended.wait(), 10)
    await asyncio.sleep(0.05)  # a second hand-over would come by now
    return sent.response, len(calls), parts


async def warm(http: HttpClient, server: Scripted) -> None:
    """One call read the usual way, so that its connection waits idle for `send_now`."""
    response = await http.request("POST", server.url + URL_PATH, {}, b"{}")
    await response.read()


async def past_warm_up(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
) -> None:
    """A script's start: `warm`'s call answered, the collected call's request read."""
    await state.read_request(reader)
    writer.write(OK)
    await state.read_request(reader)


def answers_then_keeps_alive(*parts: bytes) -> Script:
    """A script that answers the collected call with `parts`, each written and drained, then
    answers every later call on the connection."""

    async def answer(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        await past_warm_up(reader, writer, state)
        for part in parts:
            writer.write(part)
            await writer.drain()
        await keep_alive(reader, writer, state)

    return answer


def test_a_collected_answer_is_kept_whole_past_the_high_water_mark() -> None:
    """Nobody reads until the end, so reading must not pause: the whole body arrives, once,
    with the time of its first bytes, and the connection serves the next call."""
    total = 4 * HIGH_WATER
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n".encode()

    async def main() -> None:
        async with scripted(answers_then_keeps_alive(head, *[b"z" * HIGH_WATER] * 4)) as server:
            http = client()
            await warm(http, server)
            sent_at = time.perf_counter()
            response, handed_over, parts = await collect(http, server.url)
            assert handed_over == 1
            assert (response.status, response.error) == (200, None)
            assert sum(len(c) for c in parts) == total
            assert sent_at < response.first_body_at < time.perf_counter()
            response.close()
            second, _, parts = await collect(http, server.url)
            assert (second.status, b"".join(parts)) == (200, b"{}")
            second.close()
            await http.close()
        assert server.connections == 1

    asyncio.run(main())


def test_a_body_sent_a_byte_per_chunk_reaches_the_sink_a_read_at_a_time() -> None:
    """llhttp hands over each chunk of a chunked body on its own: kept that way, 8 MB sent
    a byte per chunk would be eight million objects (over 300 MB) for 8 MB of answer."""
    count = 30_000
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    byte_chunks = answers_then_keeps_alive(head, b"1\r\nz\r\n" * count + b"0\r\n\r\n")

    async def main() -> None:
        async with scripted(byte_chunks) as server:
            http = client()
            await warm(http, server)
            response, handed_over, parts = await collect(http, server.url)
            assert (handed_over, response.status, response.error) == (1, 200, None)
            assert b"".join(parts) == b"z" * count
            assert len(parts) < count // 100
            response.close()
            await http.close()

    asyncio.run(main())


def test_a_collected_answer_times_out_on_silence_with_bytes_buffered() -> None:
    """Bytes waiting for the end are no reader's to take, so they do not defer the read
    timeout: the upstream's silence ends the answer, with what came and the error."""

    async def stalls_mid_body(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        await past_warm_up(reader, writer, state)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(30)

    async def main() -> None:
        async with scripted(stalls_mid_body) as server:
            http = client(read_timeout=0.5)
            await warm(http, server)
            response, handed_over, parts = await collect(http, server.url)
            assert handed_over == 1
            assert response.status == 200
            assert isinstance(response.error, ReadTimeout)
            assert parts == [b"abc"]
            response.close()
            await http.close()

    asyncio.run(main())


def test_a_connection_dropped_before_the_answer_is_handed_over_as_such() -> None:
    """No status and a `before_answer` disconnect: what a copy sends again on a new one."""

    async def main() -> None:
        async with scripted(one_answer_per_connection) as server:
            http = client()
            await warm(http, server)
            response, handed_over, _ = await collect(http, server.url)
            assert handed_over == 1
            assert response.status == 0
            assert isinstance(response.error, ServerDisconnected)
            assert response.error.before_answer
            response.close()
            await http.close()

    asyncio.run(main())


def test_an_answer_closed_before_its_end_is_never_handed_over() -> None:
    """A cancelled copy closes its answer: nothing is handed over later, and the slot and
    the connection (dropped, the answer unfinished) are given back."""

    async def slow(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: Scripted
    ) -> None:
        await past_warm_up(reader, writer, state)
        await asyncio.sleep(0.3)
        writer.write(OK)
        await writer.drain()

    async def main() -> None:
        async with scripted(slow) as server:
            http = client(max_connections=1)
            await warm(http, server)
            sent = http.send_now("POST", server.url + URL_PATH, {}, b"{}")
            assert sent is not None
            calls: list[int] = []
            sent.response.collect(lambda: calls.append(1), [])
            sent.response.close()
            await asyncio.sleep(0.6)
            assert calls == []
            await warm(http, server)  # its one slot is free again, on a new connection
            await http.close()
        assert server.connections == 2

    asyncio.run(main())
