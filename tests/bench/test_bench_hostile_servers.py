"""`kvmigrate bench` against servers that are no LLM endpoint, and with bad arguments: a
one-line error, bounded time and memory, never a traceback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from kvmigrate.cli import main
from kvmigrate.serving import BackgroundServer


def bench(*args: str) -> Result:
    return CliRunner().invoke(main, ["bench", "--conversations", "1", "--turns", "1", *args])


def _clean_exit(result: Result, code: int) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == code, result.output


async def _html(_request: web.Request) -> web.Response:
    return web.Response(text="<html><body>hello</body></html>", content_type="text/html")


async def _endless(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunk = b"x" * 65536  # one line that never ends: the SSE decoder would buffer it all
    while True:
        await response.write(chunk)


@pytest.fixture
def server() -> Iterator[BackgroundServer]:
    def factory() -> web.Application:
        app = web.Application()
        app.add_routes([web.get("/html/v1/models", _html), web.post("/html/v1/{tail:.*}", _html),
                        web.get("/endless/v1/models", _endless),
                        web.post("/endless/v1/{tail:.*}", _endless)])  # fmt: skip
        return app

    running = BackgroundServer(factory).start()
    yield running
    running.stop()


def test_an_html_page_is_no_model_list(server: BackgroundServer) -> None:
    result = bench("--base-url", f"{server.url}/html/v1")
    _clean_exit(result, 1)
    assert "no OpenAI model list" in result.output


def test_an_html_page_is_no_answer(server: BackgroundServer) -> None:
    result = bench("--base-url", f"{server.url}/html/v1", "--model", "m")
    _clean_exit(result, 1)
    assert "every request failed" in result.output


@pytest.mark.parametrize("model", [[], ["--model", "m"]], ids=["models", "chat"])
def test_an_endless_answer_ends_at_the_cap_or_the_timeout(
    server: BackgroundServer, model: list[str]
) -> None:
    started = time.monotonic()
    result = bench("--base-url", f"{server.url}/endless/v1", "--timeout", "5", *model)
    _clean_exit(result, 1)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("option", ["--base-url", "--vs"])
@pytest.mark.parametrize("url", ["http://[::1", "htp:/bad", "http://host:99999/v1", "localhost"])
def test_a_malformed_url_is_a_usage_error(option: str, url: str) -> None:
    args = [option, url] if option == "--base-url" else ["--base-url", "http://h/v1", option, url]
    result = bench(*args)
    _clean_exit(result, 2)
    assert option in result.output


def test_an_html_file_in_a_missing_folder_is_refused_before_any_request(tmp_path: Path) -> None:
    # Port 9 (discard) is never asked: the option fails first.
    result = bench("--base-url", "http://127.0.0.1:9/v1", "--html", str(tmp_path / "no" / "x.html"))
    _clean_exit(result, 2)
    assert "does not exist" in result.output
