"""The least proxy our stack can be: an aiohttp server that forwards every request to one
upstream through an aiohttp client session set up as kvmigrate's (no decompression, no
cookie jar, no User-Agent), and relays the answer chunk by chunk, on uvloop.

No routing, no identity, no records, no metrics: what it adds over the upstream is what
aiohttp and the loop cost on their own, the floor under kvmigrate's `forwarding` figure.
proxy_overhead.py runs it as the `aiohttp-floor` target, so the gap between the two is
kvmigrate's own code and the gap between this and `direct` is the transport's.

`--client lean` swaps aiohttp's client for kvmigrate's own upstream client
(`kvmigrate.proxy.client`: llhttp through httptools on a plain asyncio protocol): the
`lean-client-floor` target, what that transport costs with nothing else around it.

    python benchmarks/floor_proxy.py --port 9100 --upstream http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp
from aiohttp import web

from kvmigrate.proxy.client import HttpClient

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "upgrade"}
)


async def relay(
    request: web.Request,
    status: int,
    headers: Mapping[str, str],
    read_whole: Callable[[], Awaitable[bytes]],
    chunks: AsyncIterator[bytes],
) -> web.StreamResponse:
    """The answer to the client: whole, or chunk by chunk for an event stream."""
    relayed = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
    if "text/event-stream" not in headers.get("content-type", ""):
        return web.Response(status=status, body=await read_whole(), headers=relayed)
    client = web.StreamResponse(status=status, headers=relayed)
    await client.prepare(request)
    async for chunk in chunks:
        await client.write(chunk)
    await client.write_eof()
    return client


def make_lean_app(upstream: str) -> web.Application:
    client: HttpClient | None = None

    async def forward(request: web.Request) -> web.StreamResponse:
        nonlocal client
        if client is None:
            client = HttpClient(max_connections=1000, connect_timeout=5, read_timeout=600)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        response = await client.request(request.method, upstream + request.path_qs, headers, body)
        try:
            return await relay(
                request, response.status, response.headers, response.read, response.iter_any()
            )
        finally:
            response.close()

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
        try:
            return await relay(
                request,
                response.status,
                response.headers,
                response.read,
                response.content.iter_any(),
            )
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
