"""The /admin API's bodies are typed: a body that does not fit gets a 400 naming the field,
and `RemoteRollout` hands the CLI the controller's own types. A real proxy on loopback."""

from __future__ import annotations

import json
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
server: {{admin_key: {KEY}}}
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
rollout: {{state: "sqlite:///{tmp}/state.db", gates: {{min_requests: 5}}}}
record: {{enabled: false}}
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
        ("/admin/rollout", b"{}", 'send {"percent": N} or {"mode": "shadow"|"split"}', None),
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
