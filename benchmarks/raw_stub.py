"""The cheapest upstream we can write in Python: a raw asyncio protocol on uvloop that answers
every request with upstream_stub's canned, non-streamed chat completion.

For the `--workers` cell of proxy_overhead.py: on a 2-core machine the stub shares the
cores with the proxy's workers and the load generator, and aiohttp's server spent about as
much CPU per request as the proxy itself, so the second worker's core went half to the stub.
This one parses only what it must (the header block and Content-Length) and answers with one
prebuilt buffer. HTTP/1.1 keep-alive, no chunked request bodies (no client here sends one).

    python benchmarks/raw_stub.py --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

from upstream_stub import COMPLETION

RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    + b"Content-Length: %d\r\n\r\n" % len(COMPLETION)
    + COMPLETION
)


class Answer(asyncio.Protocol):
    """One connection: reads requests as they come and answers each one whole."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        answers = 0
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = _content_length(self.buffer[:end])
            if len(self.buffer) < end + 4 + length:
                break  # the body is still on its way
            self.buffer = self.buffer[end + 4 + length :]
            answers += 1
        if answers and self.transport is not None:
            if self.delay:  # as an engine's prefill; every answer waits alike, so in order
                asyncio.get_running_loop().call_later(
                    self.delay, self.transport.write, RESPONSE * answers
                )
            else:
                self.transport.write(RESPONSE * answers)


def _content_length(head: bytes) -> int:
    at = head.lower().find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    value = head[at + 17 :].split(b"\r\n", 1)[0]
    return int(value.strip())


async def serve(host: str, port: int, delay: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: Answer(delay), host, port, backlog=4096)
    print(f"raw stub on http://{host}:{port}/v1", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="answer this much later")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.host, args.port, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
