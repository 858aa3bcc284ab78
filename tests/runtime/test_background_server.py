"""BackgroundServer.stop returns once the app's cleanup has finished, and says so when it
has not: the demo and the fleet bench read the records the proxy's cleanup writes."""

from __future__ import annotations

import asyncio
import inspect
import threading
import urllib.request

import pytest
from aiohttp import web

from kvmigrate.recorder.addon import RecorderAddon
from kvmigrate.serving import BackgroundServer


def _app_whose_cleanup_takes(seconds: float, done: threading.Event) -> web.Application:
    app = web.Application()

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/health", health)

    async def slow_cleanup(_: web.Application) -> None:
        await asyncio.sleep(seconds)
        done.set()

    app.on_cleanup.append(slow_cleanup)
    return app


def test_stop_waits_for_the_cleanup() -> None:
    done = threading.Event()
    server = BackgroundServer(lambda: _app_whose_cleanup_takes(0.5, done)).start()
    with urllib.request.urlopen(server.url + "/health", timeout=10) as answer:
        assert answer.read() == b"ok"
    server.stop(timeout=20)
    assert done.is_set()


def test_a_cleanup_past_the_timeout_is_an_error_not_a_silent_return() -> None:
    done = threading.Event()
    server = BackgroundServer(lambda: _app_whose_cleanup_takes(2.0, done)).start()
    thread = server._thread
    with pytest.raises(TimeoutError, match=r"did not finish its cleanup in 0\.2 s"):
        server.stop(timeout=0.2)
    assert not done.is_set()
    assert thread is not None
    thread.join(10)  # the cleanup still runs to its end
    assert done.is_set()


def test_the_default_wait_outlasts_the_recorders_own() -> None:
    """The recorder's close waits this long for its workers: a stop that gave up first
    would return while the last records were still being written."""
    stop_default = inspect.signature(BackgroundServer.stop).parameters["timeout"].default
    recorder_default = inspect.signature(RecorderAddon.close).parameters["timeout"].default
    assert stop_default > recorder_default
