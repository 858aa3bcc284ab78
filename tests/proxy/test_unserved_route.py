"""A candidate that does not serve a route (an older vLLM without /v1/responses answers
404, a server that knows the path but not the method 405): in split mode the request falls
back to the primary before the first byte, counted and logged once; in shadow mode the copy
counts as the candidate's error. Real emulators, the official openai SDK."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from aiohttp import web
from proxy_support import HOSTED_MODEL, ProxyFactory

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer

Handler = Callable[[web.Request], Any]


def without_responses(profile: str, status: int) -> BackgroundServer:
    """An emulator less its Responses API, answering `status` there."""

    @web.middleware
    async def no_responses(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1/responses"):
            return web.json_response({"detail": "Not Found"}, status=status)
        response: web.StreamResponse = await handler(request)
        return response

    def factory() -> web.Application:
        app = build_app(EmulatorSettings(profile=profile, time_scale=0))
        app.middlewares.insert(0, no_responses)
        return app

    return BackgroundServer(factory)


@pytest.fixture(params=[404, 405])
def older_vllm(request: pytest.FixtureRequest) -> Iterator[BackgroundServer]:
    """The vLLM emulator, less its Responses API: what a vLLM from before it answers."""
    with without_responses("vllm", request.param) as server:
        yield server


def ask(proxy: Any) -> str:
    raw = proxy.client().responses.with_raw_response.create(
        model=HOSTED_MODEL, input="Name a river.", max_output_tokens=16
    )
    assert raw.parse().output_text
    return str(raw.headers["x-kvmigrate-backend"])


def test_split_falls_back_to_the_primary_counts_and_logs_once(
    make_proxy: ProxyFactory, older_vllm: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 100}", vllm_url=older_vllm.url)
    with caplog.at_level(logging.WARNING, logger="kvmigrate.proxy"):
        assert [ask(proxy), ask(proxy)] == ["hosted", "hosted"]
    assert proxy.metric("kvmigrate_fallbacks_total", reason="route_not_served") == 2
    warned = [r for r in caplog.records if "does not seem to serve" in r.getMessage()]
    assert len(warned) == 1
    assert "/v1/responses" in warned[0].getMessage()
    # A route it serves is still the candidate's.
    chat = proxy.client().chat.completions.with_raw_response.create(
        model=HOSTED_MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.headers["x-kvmigrate-backend"] == "vllm"


def test_without_fallback_the_candidates_answer_stands(
    make_proxy: ProxyFactory, older_vllm: BackgroundServer
) -> None:
    proxy = make_proxy(
        rollout="{mode: split, percent: 100, fallback: false}", vllm_url=older_vllm.url
    )
    raw = proxy.client().responses.with_raw_response
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the SDK's class varies by status
        raw.create(model=HOSTED_MODEL, input="Name a river.", max_output_tokens=16)
    assert getattr(caught.value, "status_code", None) in (404, 405)
    assert proxy.metric("kvmigrate_fallbacks_total") == 0


def test_shadow_copy_counts_as_the_candidates_error(
    make_proxy: ProxyFactory, older_vllm: BackgroundServer
) -> None:
    proxy = make_proxy(rollout="{mode: shadow, shadow_sample: 1.0}", vllm_url=older_vllm.url)
    assert ask(proxy) == "hosted"
    labels = {"backend": "vllm", "role": "shadow", "error": "route_not_served"}
    deadline = time.monotonic() + 30  # the copy runs in the background: wait for it
    while proxy.metric("kvmigrate_errors_total", **labels) < 1:
        assert time.monotonic() < deadline, "the shadow copy's error was never counted"
        time.sleep(0.05)
    assert proxy.metric("kvmigrate_errors_total", **labels) == 1


def test_a_404_the_primary_gave_too_is_not_the_candidates_error(
    make_proxy: ProxyFactory, older_vllm: BackgroundServer
) -> None:
    """The request itself was not served (here the primary lacks the route as well): the
    candidate's matching answer is no evidence against it."""
    with without_responses("hosted", 404) as older_hosted:
        proxy = make_proxy(
            rollout="{mode: shadow, shadow_sample: 1.0}",
            hosted_url=older_hosted.url,
            vllm_url=older_vllm.url,
        )
        client = proxy.client()
        # The primary has served this client's key once: copies of its requests go out.
        client.chat.completions.create(
            model=HOSTED_MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=HOSTED_MODEL, input="Name a river.")
        copies = {"backend": "vllm", "role": "shadow"}
        deadline = time.monotonic() + 30  # the copy runs in the background: wait for it
        while proxy.metric("kvmigrate_requests_total", **copies, route="responses") < 1:
            assert time.monotonic() < deadline, "the shadow copy was never counted"
            time.sleep(0.05)
        # A client error, like the primary's (which the gates do not hold against a
        # backend), not `route_not_served` (which they do).
        assert proxy.metric("kvmigrate_errors_total", error="route_not_served") == 0
        as_client_error = [
            proxy.metric("kvmigrate_errors_total", **copies, error=f"http_{status}")
            for status in (404, 405)
        ]
        assert sum(as_client_error) == 1
