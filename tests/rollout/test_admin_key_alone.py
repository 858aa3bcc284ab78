"""Only `server.admin_key` opens the /admin API: the clients' `master_key` never does, so a
client that may call the models cannot move the rollout. A real proxy on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from admin_http import admin_call

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
    status, raw, _ = admin_call(proxy.url, path, MASTER, body, method)
    return status, json.loads(raw)


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


ADMIN = "kvm-admin-0123456789abcdef"
INVALID = {
    "message": "A valid admin key is required.",
    "type": "invalid_request_error",
    "param": None,
    "code": "invalid_admin_key",
}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {ADMIN[:-1]}"},
        {"Authorization": f"Bearer {ADMIN[:1]}"},
        {"Authorization": f"Bearer {ADMIN}0"},
        {"Authorization": f"Bearer {ADMIN.upper()}"},
        {"Authorization": f"Basic {ADMIN}"},
        {"Authorization": f"Bearer {MASTER}"},
        {"api-key": ADMIN[:-1]},
        {"x-api-key": ""},
    ],
    ids=lambda h: repr(h)[:60],
)
def test_only_the_admin_key_itself_opens_the_admin_api(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    """An empty key, a prefix of the key, the key and one more character, its upper case:
    each is refused, and only the key itself reads the rollout."""
    config = parse_config(
        f"""
server: {{master_key: {MASTER}, admin_key: {ADMIN}}}
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

    def get(sent: dict[str, str]) -> tuple[int, object]:
        status, raw, _ = admin_call(server.url, "/admin/rollout", None, headers=sent)
        return status, json.loads(raw)

    with BackgroundServer(lambda: build_app(config, record=False)) as server:
        assert get(headers) == (401, {"error": INVALID})
        status, answer = get({"Authorization": f"Bearer {ADMIN}"})
    assert status == 200
    assert isinstance(answer, dict)
    assert answer["state"]["percent"] == 0
