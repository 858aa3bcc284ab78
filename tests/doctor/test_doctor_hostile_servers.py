"""`kvmigrate doctor` against servers that are not quite (or not at all) OpenAI-compatible:
each must fail a check with a reason, never crash or buffer an endless answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from kvmigrate.cli import main
from kvmigrate.serving import BackgroundServer


def _server(routes: list[web.RouteDef]) -> Iterator[BackgroundServer]:
    def factory() -> web.Application:
        app = web.Application()
        app.add_routes(routes)
        return app

    server = BackgroundServer(factory).start()
    try:
        yield server
    finally:
        server.stop()


def _doctor(url: str) -> Result:
    return CliRunner().invoke(main, ["doctor", "--base-url", f"{url}/v1"])


def _no_crash(result: Result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output


async def _endless(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"data": [')
    chunk = b'{"id": "m"},' * 4096
    while True:
        await response.write(chunk)


@pytest.fixture
def endless() -> Iterator[BackgroundServer]:
    yield from _server([web.get("/v1/models", _endless)])


def test_an_endless_answer_fails_the_check_at_the_size_cap(endless: BackgroundServer) -> None:
    started = time.monotonic()
    result = _doctor(endless.url)
    _no_crash(result)
    assert result.exit_code == 1
    assert "more than" in result.output
    assert "bytes" in result.output
    # The cap ends the read long before the 60 s request timeout would.
    assert time.monotonic() - started < 30


def _json_server(models: Any, chat: Any) -> Iterator[BackgroundServer]:
    async def models_handler(_request: web.Request) -> web.Response:
        return web.json_response(models)

    async def chat_handler(_request: web.Request) -> web.Response:
        return web.json_response(chat)

    yield from _server(
        [
            web.get("/v1/models", models_handler),
            web.post("/v1/chat/completions", chat_handler),
            web.post("/v1/responses", chat_handler),
        ]
    )


USAGE = {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}


@pytest.mark.parametrize(
    ("models", "chat"),
    [
        ({"data": [1, 2]}, {}),
        ({"data": [None]}, {}),
        ({"data": [{"id": "m"}]}, {"choices": "abc", "usage": USAGE}),
        ({"data": [{"id": "m"}]}, {"choices": [5], "usage": USAGE}),
        ({"data": [{"id": "m"}]}, {"choices": [{"message": "x"}], "usage": USAGE}),
        ({"data": [{"id": "m"}]}, {"choices": [{"message": {"content": 5}}], "usage": USAGE}),
    ],
    ids=["int-cards", "null-cards", "choices-str", "choices-int", "message-str", "content-int"],
)
def test_answers_of_the_wrong_shape_fail_checks_without_a_traceback(models: Any, chat: Any) -> None:
    for server in _json_server(models, chat):
        result = _doctor(server.url)
        _no_crash(result)
        assert "Traceback" not in result.output
        if models["data"] in ([1, 2], [None]):
            assert result.exit_code == 1
            assert "FAIL  reachable" in result.output
