"""Only `server.admin_key` opens the /admin API: the clients' `master_key` never does, so a
client that may call the models cannot move the rollout. A real proxy on loopback."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.runtime import build_app
from kvmigrate.serving import BackgroundServer

MASTER = "sk-clients-key"


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return parse_config(
        f"""
server: {{master_key: {MASTER}}}
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout: {{state: "sqlite:///{tmp_path}/state.db"}}
record: {{enabled: false, db: "sqlite:///{tmp_path}/records.db"}}
""",
        env={},
    )


@pytest.fixture
def proxy(config: Config) -> Iterator[BackgroundServer]:
    with BackgroundServer(lambda: build_app(config, record=False)) as server:
        yield server


def call(
    proxy: BackgroundServer, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        proxy.url + path,
        data=body,
        method=method,
        headers={"Authorization": f"Bearer {MASTER}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


DISABLED = {
    "message": "The admin API is disabled: set server.admin_key to enable it.",
    "type": "invalid_request_error",
    "param": None,
    "code": "admin_disabled",
}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/admin/rollout", None),
        ("GET", "/admin/rollout/history", None),
        ("POST", "/admin/rollout", b'{"percent": 100, "force": true}'),
        ("POST", "/admin/rollback", b"{}"),
    ],
)
def test_the_master_key_does_not_open_the_admin_api(
    proxy: BackgroundServer, config: Config, method: str, path: str, body: bytes | None
) -> None:
    status, answer = call(proxy, method, path, body)
    assert (status, answer) == (403, {"error": DISABLED})
    controller = open_controller(config)
    try:
        state = controller.status(None).state
    finally:
        controller.store.close()
    assert (state.mode, state.percent, state.version) == ("shadow", 0, 0)
