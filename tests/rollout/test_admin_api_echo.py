"""The /admin API never sends back a client's value unbounded: a 2 MB cohort name, field
name or candidate in a refusal is cut and escaped where it is quoted. A real proxy on
loopback, with the default body limit (32 MB)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from admin_http import admin_call

from kvmigrate.config import parse_config
from kvmigrate.runtime import build_app
from kvmigrate.serving import BackgroundServer

KEY = "adm-secret"
HUGE = "\u202e" + "x" * 2_000_000


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    tmp: Path = tmp_path_factory.mktemp("admin-echo")
    config = parse_config(
        f"""
server: {{admin_key: {KEY}}}
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout: {{state: "sqlite:///{tmp}/state.db"}}
record: {{enabled: false}}
""",
        env={},
    )
    with BackgroundServer(lambda: build_app(config, record=False)) as server:
        yield server


def call(proxy: BackgroundServer, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    status, raw, _ = admin_call(proxy.url, path, KEY, body)
    return status, raw


SHOWN = "'\\u202e" + "x" * 250 + "...'"  # printable, cut to 256 characters, quoted


@pytest.mark.parametrize(
    ("path", "body", "status", "message", "param"),
    [
        ("/admin/rollout", {"percent": 0, "cohort": HUGE}, 409,
         f"no cohort {SHOWN}; cohorts: m", None),
        ("/admin/rollback", {"cohort": HUGE}, 409, f"no cohort {SHOWN}; cohorts: m", None),
        ("/admin/rollout", {"percent": 0, "candidate": HUGE}, 409,
         f"{SHOWN} is not a candidate of m; its: vllm", None),
        ("/admin/rollout", {"percent": 0, HUGE: 1}, 400,
         f"unknown field {SHOWN}; known: ", SHOWN[1:-1]),
        ("/admin/rollout", {"mode": HUGE}, 400, "mode must be ", "mode"),
    ],
)  # fmt: skip
def test_a_huge_value_comes_back_bounded(
    proxy: BackgroundServer,
    path: str,
    body: dict[str, object],
    status: int,
    message: str,
    param: str | None,
) -> None:
    code, raw = call(proxy, path, json.dumps(body).encode())
    assert code == status, raw[:500]
    assert len(raw) < 4096
    error = json.loads(raw)["error"]
    assert error["message"].startswith(message)
    assert error["param"] == param
    assert "\u202e" not in raw.decode()


def test_a_cohort_in_the_query_comes_back_bounded(proxy: BackgroundServer) -> None:
    cohort = urllib.parse.quote("\u202e" + "y" * 6000)
    code, raw = call(proxy, f"/admin/rollout?cohort={cohort}")
    assert code == 409
    message = json.loads(raw)["error"]["message"]
    assert message == "no cohort '\\u202e" + "y" * 250 + "...'; cohorts: m"
