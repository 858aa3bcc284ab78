"""A proxy in front of two emulated backends, all real servers on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiohttp import web
from proxy_support import (
    CHAT_COMPLETION,
    Backends,
    ProxyFactory,
    Recorded,
    RunningProxy,
    proxy_config,
)

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer


@pytest.fixture(scope="module")
def backends() -> Iterator[Backends]:
    """Instant emulators: time_scale 0 so the suite measures behaviour, not sleeps."""
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings(profile="vllm", time_scale=0)))
    with hosted, vllm:
        yield Backends(hosted, vllm)


@pytest.fixture
def make_proxy(backends: Backends) -> Iterator[ProxyFactory]:
    running: list[RunningProxy] = []

    def make(
        rollout: str = "{mode: shadow}",
        hosted_url: str | None = None,
        vllm_url: str | None = None,
        **kwargs: str,
    ) -> RunningProxy:
        config = proxy_config(
            hosted_url or backends.hosted.url, vllm_url or backends.vllm.url, rollout, **kwargs
        )
        server = BackgroundServer(lambda: build_proxy_app(config)).start()
        proxy = RunningProxy(server, config)
        running.append(proxy)
        return proxy

    yield make
    for proxy in running:
        for client in proxy.clients:
            client.close()
        proxy.server.stop()


@pytest.fixture
def recording_upstream() -> Iterator[tuple[BackgroundServer, list[Recorded]]]:
    """An upstream that records what reaches it, to check what the proxy forwards."""
    seen: list[Recorded] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(Recorded(request.method, request.path_qs, dict(request.headers), body))
        return web.json_response(
            CHAT_COMPLETION,
            headers={"x-request-id": "upstream-id-1", "Connection": "keep-alive"},
        )

    def make() -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    with BackgroundServer(make) as server:
        yield server, seen
