"""`/admin/rollout` row by row against a real proxy on loopback: the history's limit and
cohort, every cohort's status, who a change or rollback is written as when the caller does
not say, a change conditional on the version it saw, and what every answer is (JSON, its
refusals whole up to their bound)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_http import admin_call

from kvmigrate.config import Config, parse_config
from kvmigrate.runtime import build_app
from kvmigrate.serving import BackgroundServer

ADMIN = "sk-admin-key"
EVENTS = 104  # more than the default limit of 100


def config_in(tmp: Path) -> Config:
    return parse_config(
        f"""
server: {{admin_key: {ADMIN}}}
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
cohorts:
  - {{name: billing-bot, model: m, match: {{header: {{X-Agent: billing-bot}}}}}}
rollout: {{state: "sqlite:///{tmp}/state.db", steps: [10, 50, 100]}}
record: {{enabled: false, db: "sqlite:///{tmp}/records.db"}}
""",
        env={},
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    return config_in(tmp_path_factory.mktemp("admin"))


@pytest.fixture(scope="module")
def proxy(config: Config) -> Iterator[BackgroundServer]:
    """A proxy whose default cohort has EVENTS forced changes and billing-bot one."""
    with BackgroundServer(lambda: build_app(config, record=False)) as server:
        for number in range(EVENTS):
            percent = 10 if number % 2 == 0 else 20
            body = {"percent": percent, "force": True, "cohort": "m", "actor": f"ops-{number}"}
            assert call(server, "POST", "/admin/rollout", body)[0] == 200
        body = {"percent": 50, "force": True, "cohort": "billing-bot", "actor": "billing"}
        assert call(server, "POST", "/admin/rollout", body)[0] == 200
        yield server


def call(
    proxy: BackgroundServer, method: str, path: str, body: object = None
) -> tuple[int, Any, str]:
    """(status, JSON body, Content-Type) of one admin call."""
    sent = None if body is None else json.dumps(body).encode()
    status, raw, content_type = admin_call(proxy.url, path, ADMIN, sent, method)
    return status, json.loads(raw), content_type


def history(proxy: BackgroundServer, query: str) -> list[dict[str, Any]]:
    status, body, _ = call(proxy, "GET", "/admin/rollout/history" + query)
    assert status == 200, body
    return list(body["events"])


@pytest.mark.parametrize(
    ("query", "count"),
    [
        ("?cohort=m", 100),  # the default limit
        ("?cohort=m&limit=3", 3),
        ("?cohort=m&limit=1", 1),
        ("?cohort=m&limit=0", 1),  # at least one
        ("?cohort=m&limit=-7", 1),
        (f"?cohort=m&limit={EVENTS + 50}", EVENTS),
        ("?cohort=billing-bot", 1),
    ],
)
def test_the_history_holds_the_newest_events_up_to_its_limit(
    proxy: BackgroundServer, query: str, count: int
) -> None:
    events = history(proxy, query)
    assert len(events) == count
    cohort = "billing-bot" if "billing-bot" in query else "m"
    assert {e["cohort"] for e in events} == {cohort}
    if cohort == "m":  # the newest, oldest first
        assert [e["actor"] for e in events] == [f"ops-{i}" for i in range(EVENTS - count, EVENTS)]
    else:
        assert [(e["actor"], e["to_percent"]) for e in events] == [("billing", 50.0)]


@pytest.mark.parametrize("limit", ["abc", "1.5", "", "%F0%9F%98%80"])
def test_a_limit_that_is_no_whole_number_is_a_400_naming_it(
    proxy: BackgroundServer, limit: str
) -> None:
    status, body, content_type = call(proxy, "GET", f"/admin/rollout/history?limit={limit}")
    assert (status, content_type) == (400, "application/json")
    assert body == {
        "error": {
            "message": "limit must be a whole number",
            "type": "invalid_request_error",
            "param": "limit",
            "code": None,
        }
    }


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[BackgroundServer]:
    config = config_in(tmp_path)
    with BackgroundServer(lambda: build_app(config, record=False)) as server:
        yield server


def test_every_cohorts_status(fresh: BackgroundServer) -> None:
    """(A proxy of its own: mutmut runs a test against the mutants of what the test itself
    called, and a module fixture's routes are the first test's.)"""
    body = {"percent": 50, "force": True, "cohort": "billing-bot"}
    assert call(fresh, "POST", "/admin/rollout", body)[0] == 200
    status, answer, content_type = call(fresh, "GET", "/admin/rollout/cohorts")
    assert (status, content_type) == (200, "application/json")
    statuses = answer["cohorts"]
    assert [(s["cohort"], s["state"]["mode"], s["state"]["percent"]) for s in statuses] == [
        ("billing-bot", "split", 50.0),  # a named cohort first: it is matched first
        ("m", "shadow", 0.0),
    ]


def test_a_change_and_a_rollback_without_an_actor_are_written_as_the_admin_apis(
    fresh: BackgroundServer,
) -> None:
    status, answer, content_type = call(
        fresh, "POST", "/admin/rollout", {"percent": 10, "force": True, "cohort": "m"}
    )
    assert (status, content_type) == (200, "application/json"), answer
    status, answer, content_type = call(fresh, "POST", "/admin/rollback", {"cohort": "m"})
    assert (status, content_type) == (200, "application/json"), answer
    events = history(fresh, "?cohort=m&limit=2")
    assert [(e["action"], e["actor"], e["to_percent"]) for e in events] == [
        ("promote", "admin-api", 10.0),
        ("rollback", "admin-api", 0.0),
    ]


def test_a_change_conditional_on_a_version_is_refused_once_the_state_moved_on(
    fresh: BackgroundServer,
) -> None:
    change = {"percent": 10, "force": True, "cohort": "m", "expected_version": 0}
    assert call(fresh, "POST", "/admin/rollout", change)[0] == 200
    status, answer, content_type = call(fresh, "POST", "/admin/rollout", {**change, "percent": 20})
    assert (status, content_type) == (409, "application/json")
    assert answer == {
        "error": {
            "message": "the rollout changed since version 0 (now version 1: split 10%)",
            "type": "invalid_request_error",
            "param": None,
            "code": "rollout_refused",
        }
    }
    moved = {**change, "percent": 20, "expected_version": 1}
    assert call(fresh, "POST", "/admin/rollout", moved)[0] == 200


def test_a_refusal_longer_than_a_log_line_comes_back_whole(fresh: BackgroundServer) -> None:
    """The gates' refusal names every gate that holds the step: longer than a logged value
    may be (300 characters), within the admin API's own bound."""
    status, answer, content_type = call(
        fresh, "POST", "/admin/rollout", {"percent": 50, "cohort": "m"}
    )
    assert (status, content_type) == (409, "application/json")
    message = answer["error"]["message"]
    assert answer["error"]["code"] == "gates_refused"
    assert 300 < len(message) <= 2048, message
    assert not message.endswith("..."), message
    for gate in answer["gates"]:
        if gate["verdict"] != "passed":
            assert f"{gate['name']} {gate['verdict']}: {gate['detail']}" in message
