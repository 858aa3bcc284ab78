"""The /admin API's bodies are typed: a body that does not fit gets a 400 naming the field,
and `RemoteRollout` hands the CLI the controller's own types. A real proxy on loopback."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmigrate.config import parse_config
from kvmigrate.policies.gates import GateResult, Verdict
from kvmigrate.rollout.client import RemoteRollout
from kvmigrate.rollout.controller import ChangeOutcome, GatesRefused, RolloutStatus
from kvmigrate.rollout.state import RolloutEvent
from kvmigrate.runtime import build_app
from kvmigrate.serving import BackgroundServer

KEY = "adm-secret"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    tmp: Path = tmp_path_factory.mktemp("admin")
    config = parse_config(
        f"""
server: {{admin_key: {KEY}, max_body_bytes: 4096, body_timeout_seconds: 0.5}}
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout: {{state: "sqlite:///{tmp}/state.db", gates: {{min_requests: 5}}}}
record: {{enabled: false, db: "sqlite:///{tmp}/records.db"}}
""",
        env={},
    )
    with BackgroundServer(lambda: build_app(config, record=False)) as server:
        yield server


def post(proxy: BackgroundServer, path: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        proxy.url + path,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("path", "body", "message", "param"),
    [
        ("/admin/rollout", b"{not json", "the body is not valid JSON", None),
        ("/admin/rollout", b"[50]", "the body must be a JSON object", None),
        ("/admin/rollout", b"{}", 'send {"percent": N} and/or {"mode": "shadow"|"split"}', None),
        (
            "/admin/rollout",
            b'{"percent": "50"}',
            "percent must be a number between 0 and 100",
            "percent",
        ),
        (
            "/admin/rollout",
            b'{"percent": true}',
            "percent must be a number between 0 and 100",
            "percent",
        ),
        (
            "/admin/rollout",
            b'{"percent": 150}',
            "percent must be a number between 0 and 100",
            "percent",
        ),
        ("/admin/rollout", b'{"mode": "canary"}', 'mode must be "shadow" or "split"', "mode"),
        (
            "/admin/rollout",
            b'{"percent": 10, "force": "yes"}',
            "force must be true or false",
            "force",
        ),
        ("/admin/rollout", b'{"percent": 10, "reason": 3}', "reason must be a string", "reason"),
        ("/admin/rollout", b'{"percnt": 10}', "unknown field 'percnt'", "percnt"),
        ("/admin/rollback", b'{"actor": ["me"]}', "actor must be a string", "actor"),
        ("/admin/rollback", b'{"why": "x"}', "unknown field 'why'; known: reason, actor", "why"),
    ],
)
def test_a_body_that_does_not_fit_is_a_400_naming_the_field(
    proxy: BackgroundServer, path: str, body: bytes, message: str, param: str | None
) -> None:
    status, answer = post(proxy, path, body)
    assert status == 400
    error = answer["error"]
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(message)
    assert error["param"] == param


def test_the_remote_client_hands_back_the_controllers_types(proxy: BackgroundServer) -> None:
    client = RemoteRollout(proxy.url, KEY, actor="tester")
    status = client.status()
    assert isinstance(status, RolloutStatus)
    assert status.steps == [10.0, 50.0, 100.0]
    assert status.next_step == 10.0
    assert all(isinstance(g, GateResult) for g in status.gates_for_next_step)
    assert {g.verdict for g in status.gates_for_next_step} <= set(Verdict)

    with pytest.raises(GatesRefused) as refused:
        client.set_percent(10, "too early", force=False)
    assert refused.value.results
    assert all(isinstance(g.verdict, Verdict) for g in refused.value.results)

    outcome = client.set_percent(10, "forced", force=True)
    assert isinstance(outcome, ChangeOutcome)
    assert (outcome.state.mode, outcome.state.percent) == ("split", 10.0)
    assert outcome.event.forced
    assert outcome.event.actor == "tester"
    assert client.set_mode("shadow", "back to shadow").state.mode == "shadow"
    rolled = client.set_percent(20, "again", force=True)
    assert client.rollback("bad").state.percent < rolled.state.percent

    events = client.history(10)
    assert all(isinstance(e, RolloutEvent) for e in events)
    assert [e.reason for e in events] == ["forced", "back to shadow", "again", "bad"]
    assert client.status().state.version == events[-1].version


def send_raw(proxy: BackgroundServer, headers: list[bytes], body: bytes, pause: float = 0) -> bytes:
    """POST /admin/rollout on its own connection, its headers as given; with `pause`, the
    body's last byte is sent that much later."""
    host, port = proxy.url.removeprefix("http://").split(":")
    head = [
        b"POST /admin/rollout HTTP/1.1",
        b"Host: proxy",
        b"Connection: close",
        b"Authorization: Bearer " + KEY.encode(),
        b"Content-Type: application/json",
        *headers,
    ]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + (body[:-1] if pause else body))
        if pause:
            time.sleep(pause)
            with contextlib.suppress(OSError):  # the proxy answered and closed first
                sock.sendall(body[-1:])
        data = b""
        with contextlib.suppress(ConnectionResetError):  # closed with our bytes unread
            while chunk := sock.recv(65536):
                data += chunk
    return data


def error_of(response: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]


def test_a_body_that_does_not_match_its_content_encoding_is_a_400(proxy: BackgroundServer) -> None:
    # Before: `request.read()` raised aiohttp's payload error past the handler, a 500.
    body = b'{"percent": 10, "reason": "x"}'
    length = b"Content-Length: %d" % len(body)
    status, error = error_of(send_raw(proxy, [b"Content-Encoding: gzip", length], body))
    assert status == 400
    assert "Content-Encoding" in str(error["message"])
    # The same body, gzipped as it says, is read (and refused for what it asks, not how).
    packed = gzip.compress(b'{"percent": "ten"}')
    headers = [b"Content-Encoding: gzip", b"Content-Length: %d" % len(packed)]
    status, error = error_of(send_raw(proxy, headers, packed))
    assert (status, error["param"]) == (400, "percent")


def test_a_gzipped_body_is_held_to_the_limit_inflated_and_other_codings_are_a_415(
    proxy: BackgroundServer,
) -> None:
    packed = gzip.compress(b'{"percent": 10, "reason": "' + b"x" * 8000 + b'"}')
    assert len(packed) < 4096  # within the limit as sent, over it inflated
    headers = [b"Content-Encoding: gzip", b"Content-Length: %d" % len(packed)]
    status, error = error_of(send_raw(proxy, headers, packed))
    assert (status, error["code"]) == (413, "request_too_large")
    # Before: aiohttp's parser tried any coding (a 400), and inflated a second gzip layer.
    for coding in (b"br", b"gzip, gzip"):
        headers = [b"Content-Encoding: " + coding, b"Content-Length: 4"]
        status, error = error_of(send_raw(proxy, headers, b"abcd"))
        assert (status, error["code"]) == (415, "unsupported_content_encoding")
        assert "gzip" in str(error["message"])


def test_a_body_over_the_servers_limit_is_a_413(proxy: BackgroundServer) -> None:
    body = b'{"percent": 10, "reason": "' + b"x" * 8000 + b'"}'
    response = send_raw(proxy, [b"Content-Length: %d" % len(body)], body)
    status, error = error_of(response)
    assert (status, error["code"]) == (413, "request_too_large")


def test_a_trickled_body_is_cut_off_at_the_servers_body_timeout(proxy: BackgroundServer) -> None:
    # Before: an admin request could hold its connection for as long as its body trickled.
    body = b'{"percent": 10, "reason": "slow"}'
    response = send_raw(proxy, [b"Content-Length: %d" % len(body)], body, pause=3.0)
    status, error = error_of(response)
    assert (status, error["code"]) == (408, "request_timeout")
