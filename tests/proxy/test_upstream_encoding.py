"""A hosted API compresses its answers when the caller accepts gzip (api.openai.com does,
behind its CDN). The proxy reads every answer (usage, records, parity), so it asks upstreams
for identity bytes and relays them as they are: the client's own Accept-Encoding never
reaches an upstream, and no HTTP client default may put gzip back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from proxy_support import HOSTED_MODEL, ProxyFactory

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer

Handler = Any


@pytest.fixture
def compressing_hosted() -> Iterator[tuple[BackgroundServer, list[str]]]:
    """The hosted emulator behind a layer that gzips whole answers for any caller that
    accepts gzip, as a CDN does; it notes each request's Accept-Encoding."""
    accepted: list[str] = []

    @web.middleware
    async def compress(request: web.Request, handler: Handler) -> web.StreamResponse:
        accepted.append(request.headers.get("Accept-Encoding", ""))
        response: web.StreamResponse = await handler(request)
        if isinstance(response, web.Response):
            response.enable_compression()  # only if the request accepts an encoding
        return response

    def factory() -> web.Application:
        app = build_app(EmulatorSettings(profile="hosted", time_scale=0))
        app.middlewares.insert(0, compress)
        return app

    with BackgroundServer(factory) as server:
        yield server, accepted


def test_a_compressing_upstream_sends_the_client_plain_json(
    make_proxy: ProxyFactory, compressing_hosted: tuple[BackgroundServer, list[str]]
) -> None:
    server, accepted = compressing_hosted
    proxy = make_proxy(rollout="{mode: split, percent: 0}", hosted_url=server.url)
    # The SDK's own client accepts gzip; the proxy must not pass that on either.
    answer = proxy.client().chat.completions.create(
        model=HOSTED_MODEL, messages=[{"role": "user", "content": "Name a river."}]
    )
    assert answer.choices[0].message.content
    assert answer.usage is not None
    assert answer.usage.total_tokens > 0
    assert accepted, "the request never reached the hosted emulator"
    assert all("gzip" not in value and "deflate" not in value for value in accepted), accepted
