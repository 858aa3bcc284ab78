"""Helpers for the tests that run real LiteLLM: emulators that keep what reached them, the
rollout switches, the records database, and kvmigrate's own proxy in the LiteLLM venv."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from kvmigrate.config import Config
from kvmigrate.emulator.faults import FAULT_HEADER
from kvmigrate.emulator.server import build_app
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.serving import BackgroundServer
from kvmigrate.testbed.litellm_process import LiteLLMProxy
from kvmigrate.testbed.litellm_venv import venv_python


class Emulator:
    """An emulator that counts the requests it receives, by path, and keeps their headers
    and JSON bodies.

    `fault`, when set, is added as the `x-emulator-fault` header of every request that
    reaches it: the way to fail a backend that a client's headers cannot reach (LiteLLM
    sends only what its config says)."""

    def __init__(self, settings: EmulatorSettings) -> None:
        self.settings = settings
        self.counts: Counter[str] = Counter()
        self.headers: list[dict[str, str]] = []
        self.bodies: list[tuple[str, dict[str, Any]]] = []  # (path, body) of each POST
        self.fault: str | None = None
        self.server = BackgroundServer(self._app)

    def _app(self) -> web.Application:
        app = build_app(self.settings)

        @web.middleware
        async def observe(request: web.Request, handler: Any) -> web.StreamResponse:
            self.counts[request.path] += 1
            self.headers.append(dict(request.headers))
            if self.fault is not None:
                # Cloned before the body is read: a clone does not carry the bytes its
                # original already read, and the handler then found no body (a 500).
                request = request.clone(headers={**request.headers, FAULT_HEADER: self.fault})
            if request.method == "POST" and request.can_read_body:
                with contextlib.suppress(ValueError):
                    body = json.loads(await request.read())
                    if isinstance(body, dict):
                        self.bodies.append((request.path, body))
            response: web.StreamResponse = await handler(request)
            return response

        app.middlewares.insert(0, observe)
        return app

    def received(self, path: str, marker: str) -> list[dict[str, Any]]:
        """The bodies that reached `path` and carry `marker` anywhere, in order."""
        return [b for p, b in self.bodies if p == path and marker in json.dumps(b)]

    def total(self) -> int:
        return sum(n for path, n in self.counts.items() if path.startswith("/v1/"))


class KvmigrateProxy(LiteLLMProxy):
    """`kvmigrate proxy --config CONFIG`, run by the LiteLLM venv's python with this
    checkout on PYTHONPATH, on a free loopback port."""

    label = "kvmigrate proxy"
    ready_path = "/ready"  # 200 once the primary (here, its litellm gateway) answers

    def command(self) -> list[str]:
        command = [str(venv_python()), "-m", "kvmigrate", "proxy", "--config"]
        return [*command, str(self.config_path), "--host", "127.0.0.1", "--port", str(self.port)]


def shadow_rollout(root: Path) -> str:
    """The `rollout:` and `record:` sections of a test config: shadow mode, no noise
    samples, state and records in `root`."""
    return f"""
rollout:
  primary: hosted
  candidate: vllm
  mode: shadow
  noise_sample: 0.0
  state: sqlite:///{root}/state.db
record:
  db: sqlite:///{root}/records.db
  content: full
"""


# Records are written by a worker at the lowest CPU priority (so recording never competes
# with answers): beside a CPU hog it gets a few percent of a core and lags by seconds. On a
# quiet machine a record lands within 0.1 s; the default is a generous deadline, not a bound.
RECORDS_DEADLINE_S = 120.0


def wait_for(
    check: Callable[[], bool], timeout: float = RECORDS_DEADLINE_S, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or check}")


def set_split(config: Config, percent: float) -> int:
    """The chat model's cohort (the first model; an embeddings model has no candidate).
    Returns the store's generation after the change."""
    controller = open_controller(config)
    chat = config.models[0].model_name
    try:
        controller.set_percent(percent, reason="test", actor="test", force=True, cohort=chat)
        return controller.store.version()
    finally:
        controller.store.close()


def set_shadow(config: Config) -> int:
    """Returns the store's generation after the change."""
    controller = open_controller(config)
    chat = config.models[0].model_name
    try:
        if controller.read(chat).percent:
            controller.set_percent(0, reason="test", actor="test", cohort=chat)
        controller.set_mode("shadow", reason="test", actor="test", cohort=chat)
        return controller.store.version()
    finally:
        controller.store.close()


def records(config: Config, where: str = "1=1") -> list[sqlite3.Row]:
    db = config.record.db.removeprefix("sqlite:///")
    if not Path(db).exists():
        return []
    with sqlite3.connect(db) as connection:
        connection.row_factory = sqlite3.Row
        try:
            return list(connection.execute(f"SELECT * FROM records WHERE {where}"))
        except sqlite3.OperationalError:
            return []
