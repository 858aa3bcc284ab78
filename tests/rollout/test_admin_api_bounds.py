"""A change's `reason` and `actor` are bounded where they enter: the /admin API refuses a
longer one with a 400 naming the field and the limit (never the value), before anything
is stored or echoed; the controller and the CLI refuse it too. A real proxy on loopback,
with the default body limit (32 MB)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from admin_http import admin_call
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.config import parse_config
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.rollout.controller import ACTOR_MAX_CHARS, REASON_MAX_CHARS, NoteTooLong
from kvmigrate.runtime import build_app
from kvmigrate.serving import BackgroundServer

KEY = "adm-secret"
CONFIG = """
server: {{admin_key: {key}}}
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: m}}
rollout: {{state: "sqlite:///{root}/state.db"}}
record: {{enabled: false, db: "sqlite:///{root}/records.db"}}
"""


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[BackgroundServer]:
    config = parse_config(CONFIG.format(key=KEY, root=tmp_path), env={})
    with BackgroundServer(lambda: build_app(config, record=False)) as server:
        yield server


def call(proxy: BackgroundServer, path: str, body: object = None) -> tuple[int, bytes]:
    sent = None if body is None else json.dumps(body).encode()
    status, raw, _ = admin_call(proxy.url, path, KEY, sent)
    return status, raw


def history(proxy: BackgroundServer) -> list[dict[str, object]]:
    code, raw = call(proxy, "/admin/rollout/history")
    assert code == 200
    events: list[dict[str, object]] = json.loads(raw)["events"]
    return events


PROBE = {"percent": 10, "mode": "split", "cohort": "gpt-4o-mini", "force": True}


@pytest.mark.parametrize(
    ("path", "body", "param", "limit"),
    [
        ("/admin/rollout", {**PROBE, "reason": "A" * 1_000_000, "actor": "B" * 100_000},
         "reason", REASON_MAX_CHARS),
        ("/admin/rollout", {**PROBE, "reason": "A" * (REASON_MAX_CHARS + 1)}, "reason",
         REASON_MAX_CHARS),
        ("/admin/rollout", {**PROBE, "actor": "B" * (ACTOR_MAX_CHARS + 1)}, "actor",
         ACTOR_MAX_CHARS),
        ("/admin/rollback", {"reason": "A" * 1_000_000}, "reason", REASON_MAX_CHARS),
        ("/admin/rollback", {"actor": "B" * 100_000}, "actor", ACTOR_MAX_CHARS),
    ],
)  # fmt: skip
def test_an_overlong_reason_or_actor_is_refused_naming_the_field(
    proxy: BackgroundServer, path: str, body: dict[str, object], param: str, limit: int
) -> None:
    if path == "/admin/rollback":  # something to roll back, so only the bound can refuse
        assert call(proxy, "/admin/rollout", PROBE)[0] == 200
    before = history(proxy)
    code, raw = call(proxy, path, body)
    assert code == 400, raw[:300]
    assert len(raw) < 1024
    error = json.loads(raw)["error"]
    assert error == {
        "message": f"{param} must be a string of at most {limit} characters",
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }
    assert b"AAAA" not in raw
    assert b"BBBB" not in raw
    assert history(proxy) == before  # nothing stored


def test_a_reason_and_an_actor_at_their_limits_are_kept(proxy: BackgroundServer) -> None:
    reason, actor = "r" * REASON_MAX_CHARS, "a" * ACTOR_MAX_CHARS
    code, raw = call(proxy, "/admin/rollout", {**PROBE, "reason": reason, "actor": actor})
    assert code == 200, raw[:300]
    [event] = history(proxy)
    assert (event["reason"], event["actor"]) == (reason, actor)


def test_the_controller_refuses_what_the_cli_would_record(tmp_path: Path) -> None:
    """The CLI writes the store through the controller, not the API: the same bounds."""
    config = parse_config(CONFIG.format(key=KEY, root=tmp_path), env={})
    controller = open_controller(config)
    try:
        with pytest.raises(
            NoteTooLong, match=r"^reason must be a string of at most 1000 characters$"
        ):
            controller.change(10, "split", "A" * 1_000_000, "cli", force=True)
        with pytest.raises(
            NoteTooLong, match=r"^actor must be a string of at most 200 characters$"
        ):
            controller.change(10, "split", "why", "B" * 100_000, force=True)
        assert controller.history() == []
        controller.change(10, "split", "why", "cli", force=True)
        with pytest.raises(NoteTooLong):
            controller.rollback("A" * 1_000_000, "cli")
        # The proxy's own rollback is never refused for its words: they are cut.
        outcome = controller.rollback("A" * 5000, "auto-rollback@host", automatic=True)
        assert outcome.event.reason == "A" * REASON_MAX_CHARS
        assert outcome.event.to_percent == 0
    finally:
        controller.store.close()


@pytest.mark.parametrize("command", [["rollout", "--percent", "10"], ["rollback"]])
def test_the_cli_refuses_an_overlong_reason_before_the_store(
    tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(key=KEY, root=tmp_path))
    reason = "A" * (REASON_MAX_CHARS + 1)
    result = CliRunner().invoke(main, [*command, "--config", str(path), "--reason", reason])
    assert result.exit_code == 2, result.output
    assert "--reason" in result.output
    assert f"at most {REASON_MAX_CHARS} characters" in result.output
    assert "AAAA" not in result.output
    assert not (tmp_path / "state.db").exists()
