"""`kvmigrate plan --calibrate` against endpoints that cannot be probed, served for real on
loopback: a closed port, an emulated vLLM that refuses the key or the model, a server that
answers 503. Each is one line naming the URL and the HTTP status, never the key, and exit
code 1, never a traceback."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from kvmigrate.cli import main
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.serving import BackgroundServer

RIGHT_KEY = "sk-right-0123456789"
WRONG_KEY = "sk-wrong-9876543210"


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    return path


@pytest.fixture(scope="module")
def keyed() -> Iterator[str]:
    settings = EmulatorSettings(profile="vllm", time_scale=0.0, api_key=RIGHT_KEY)
    with BackgroundServer(lambda: build_app(settings)) as server:
        yield server.url + "/v1"


def calibrate(dataset: Path, url: str, *args: str) -> Result:
    argv = ["plan", "--dataset", str(dataset), "--replicas", "1", "--calibrate", url, *args]
    return CliRunner().invoke(main, argv)


def failed(result: Result) -> str:
    """The one error line, after checking it is one and nothing crashed."""
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "Fleet sizes" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed when the block ends: nothing listens there


def test_a_closed_port_names_the_url(dataset: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    line = failed(calibrate(dataset, url))
    assert line == (
        f"Error: calibration failed: cannot connect to {url}: "
        "ConnectError: All connection attempts failed"
    )
    # With the model named, the model list is not asked: the first request fails instead.
    line = failed(calibrate(dataset, url, "--calibrate-model", "m"))
    assert line == (
        f"Error: calibration failed: the warm-up request to {url} failed: "
        "APIConnectionError: Connection error."
    )


@pytest.mark.parametrize(
    "model", [[], ["--calibrate-model", "meta-llama/Llama-3.1-8B-Instruct"]], ids=["list", "named"]
)
def test_a_refused_key_says_so_and_never_shows_it(
    dataset: Path, keyed: str, model: list[str]
) -> None:
    result = calibrate(dataset, keyed, "--api-key", WRONG_KEY, *model)
    line = failed(result)
    assert "HTTP 401" in line
    assert "--api-key" in line
    assert keyed in line
    # Neither the key nor the part of it the server quotes back ("sk-***3210").
    assert WRONG_KEY not in result.output
    assert WRONG_KEY[-4:] not in result.output


def test_a_model_the_server_does_not_serve(dataset: Path, keyed: str) -> None:
    line = failed(calibrate(dataset, keyed, "--api-key", RIGHT_KEY, "--calibrate-model", "nope"))
    assert line == (
        f"Error: calibration failed: the warm-up request to {keyed} failed: "
        "http 404: The model `nope` does not exist."
    )


def test_a_server_error_gives_its_status(dataset: Path) -> None:
    async def unavailable(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "overloaded"}}, status=503)

    def app() -> web.Application:
        application = web.Application()
        application.router.add_get("/v1/models", unavailable)
        return application

    with BackgroundServer(app) as server:
        url = server.url + "/v1"
        line = failed(calibrate(dataset, url))
    assert line == f"Error: calibration failed: {url} answered HTTP 503: overloaded"
