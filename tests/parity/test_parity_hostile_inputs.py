"""`kvmigrate parity` with backends that are no LLM server and with hostile files: the gate
never passes on two failing backends, and bad input is a one-line error."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner, Result
from parity_support import HOSTED_MODEL, chat_requests, emulator, write_config, write_dataset

from kvmigrate.cli import main
from kvmigrate.serving import BackgroundServer


def parity(config: Path, dataset: Path, *extra: str) -> Result:
    args = ["parity", "--config", str(config), "--dataset", str(dataset), *extra]
    return CliRunner().invoke(main, args)


def _clean_exit(result: Result, code: int) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == code, result.output


async def _html(_request: web.Request) -> web.Response:
    return web.Response(text="<html><body>hello</body></html>", content_type="text/html")


async def _endless(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    while True:
        await response.write(b"x" * 65536)


@pytest.fixture
def junk() -> Iterator[BackgroundServer]:
    def factory() -> web.Application:
        app = web.Application()
        app.add_routes([web.post("/html/v1/{tail:.*}", _html),
                        web.post("/endless/v1/{tail:.*}", _endless)])  # fmt: skip
        return app

    server = BackgroundServer(factory).start()
    yield server
    server.stop()


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "requests.jsonl", chat_requests(25))


def test_two_backends_answering_html_never_pass_the_gate(
    tmp_path: Path, dataset: Path, junk: BackgroundServer
) -> None:
    html = f"{junk.url}/html"
    config = write_config(tmp_path / "config.yaml", html, html)
    result = parity(config, dataset, "--min-score", "0.9")
    _clean_exit(result, 1)
    assert "answered none of the requests" in result.output
    assert "PASSED" not in result.output


def test_an_unreachable_candidate_fails_the_gate(tmp_path: Path, dataset: Path) -> None:
    with emulator("hosted") as hosted:
        config = write_config(tmp_path / "config.yaml", hosted.url, "http://127.0.0.1:9")
        result = parity(config, dataset, "--min-score", "0.5", "--json")
    _clean_exit(result, 1)
    report = json.loads(result.output[result.output.index("{") :])
    assert report["answered"]["candidate"] == 0


def test_an_endless_answer_is_an_error_of_that_call(tmp_path: Path, junk: BackgroundServer) -> None:
    dataset = write_dataset(tmp_path / "one.jsonl", chat_requests(1))
    started = time.monotonic()
    with emulator("hosted") as hosted:
        config = write_config(tmp_path / "config.yaml", hosted.url, f"{junk.url}/endless")
        result = parity(config, dataset, "--timeout", "60", "--repeats", "0")
    _clean_exit(result, 0)
    assert "candidate errors: 1 (BodyTooLarge: 1)" in result.output
    assert time.monotonic() - started < 45


@pytest.mark.parametrize("data", [b"\xff\xfe{}\n", bytes(range(256))], ids=["bom", "binary"])
def test_a_dataset_that_is_not_utf8_is_a_usage_error(tmp_path: Path, data: bytes) -> None:
    dataset = tmp_path / "bad.jsonl"
    dataset.write_bytes(data)
    config = write_config(tmp_path / "config.yaml", "http://127.0.0.1:9", "http://127.0.0.1:9")
    result = parity(config, dataset)
    _clean_exit(result, 2)
    assert "not UTF-8" in result.output


def test_details_in_a_missing_folder_is_refused_before_any_request(
    tmp_path: Path, dataset: Path
) -> None:
    config = write_config(tmp_path / "config.yaml", "http://127.0.0.1:9", "http://127.0.0.1:9")
    result = parity(config, dataset, "--details", str(tmp_path / "no" / "details.jsonl"))
    _clean_exit(result, 2)
    assert "does not exist" in result.output
    assert HOSTED_MODEL not in result.output


def test_request_ids_from_the_dataset_reach_the_terminal_escaped(tmp_path: Path) -> None:
    """A dataset's custom_id is anyone's text: named in the report's list of divergences,
    an escape sequence or a bidi control in it is shown escaped."""
    bodies = chat_requests(6)
    lines = [
        json.dumps({"custom_id": f"req\x1b[2J\u202e{i}", "method": "POST",
                    "url": "/v1/chat/completions", "body": body})
        for i, body in enumerate(bodies)
    ]  # fmt: skip
    dataset = tmp_path / "requests.jsonl"
    dataset.write_text("\n".join(lines) + "\n")
    baseline = tmp_path / "baseline.json"
    baseline.write_text('{"per_request": []}')  # every divergence is new
    with (
        emulator("hosted") as hosted,
        emulator("vllm", min_output_tokens=4, max_output_tokens_default=5) as short,
    ):
        config = write_config(tmp_path / "config.yaml", hosted.url, short.url)
        result = parity(config, dataset, "--repeats", "1", "--baseline", str(baseline))
    assert "new divergences" in result.output, result.output
    assert "\x1b" not in result.output
    assert "\u202e" not in result.output
    assert "req\\x1b[2J\\u202e" in result.output
