"""The least proxy our stack can be: an aiohttp server that forwards every request to one
upstream through an aiohttp client session set up as kvmigrate's (no decompression, no
cookie jar, no User-Agent), and relays the answer chunk by chunk, on uvloop.

No routing, no identity, no records, no metrics: what it adds over the upstream is what
aiohttp and the loop cost on their own, the floor under kvmigrate's `forwarding` figure.
proxy_overhead.py runs it as the `aiohttp-floor` target, so the gap between the two is
kvmigrate's own code and the gap between this and `direct` is the transport's.

`--client lean` swaps aiohttp's client for the least HTTP/1.1 client that relays these
answers (asyncio streams, a keep-alive pool, Content-Length and chunked bodies; no TLS, no
redirects, no timeouts): the `lean-client-floor` target, what a leaner upstream transport
could save. A prototype for measuring, not a client to serve with.

    python benchmarks/floor_proxy.py --port 9100 --upstream http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "upgrade"}
)


class LeanClient:
    """Keep-alive connections to one upstream; one request at a time on each."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], AsyncIterator[bytes]]:
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        fields = [tuple(x.strip() for x in line.split(":", 1)) for line in head[1:] if line]
        found = {k.lower(): v for k, v in fields}
        return status, fields, self._body(reader, writer, found)  # type: ignore[return-value]

    async def _body(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: dict[str, str]
    ) -> AsyncIterator[bytes]:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16):
                yield (await reader.readexactly(size + 2))[:-2]
            await reader.readuntil(b"\r\n")
        else:
            yield await reader.readexactly(int(headers.get("content-length", "0")))
        self.idle.append((reader, writer))


def make_lean_app(upstream: str) -> web.Application:
    client = LeanClient(upstream)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        status, fields, chunks = await client.request(
            request.method, request.path_qs, headers, body
        )
        relayed = {k: v for k, v in fields if k.lower() not in HOP_BY_HOP}
        kind = next((v for k, v in fields if k.lower() == "content-type"), "")
        if "text/event-stream" not in kind:
            answer = b"".join([chunk async for chunk in chunks])
            return web.Response(status=status, body=answer, headers=relayed)
        response = web.StreamResponse(status=status, headers=relayed)
        await response.prepare(request)
        async for chunk in chunks:
            await response.write(chunk)
        await response.write_eof()
        return response

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def make_app(upstream: str) -> web.Application:
    session: aiohttp.ClientSession | None = None

    async def open_session(_app: web.Application) -> None:
        nonlocal session
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=30),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",),
        )

    async def close_session(_app: web.Application) -> None:
        if session is not None:
            await session.close()

    async def forward(request: web.Request) -> web.StreamResponse:
        assert session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        response = await session.request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        )
        relayed = {k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            if "text/event-stream" not in response.headers.get("content-type", ""):
                answer = await response.read()
                return web.Response(status=response.status, body=answer, headers=relayed)
            client = web.StreamResponse(status=response.status, headers=relayed)
            await client.prepare(request)
            async for chunk in response.content.iter_any():
                await client.write(chunk)
            await client.write_eof()
            return client
        finally:
            response.release()

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9000")
    parser.add_argument("--client", choices=("aiohttp", "lean"), default="aiohttp")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(
        (make_lean_app if args.client == "lean" else make_app)(args.upstream.rstrip("/")),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
