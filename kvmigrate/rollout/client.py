"""One interface for the rollout commands, whether they talk to the store or to a proxy.

`LocalRollout` drives the controller over the configured store; `RemoteRollout` drives a
running proxy's /admin/rollout API. Both return plain dicts (what `--json` prints) and
raise `RolloutError` (or `GatesRefused`) for a refused change.
"""

from __future__ import annotations

import getpass
import json
import socket
import urllib.error
import urllib.request
from typing import Any, Protocol

from kvmigrate.policies.gates import GateResult, Verdict
from kvmigrate.rollout.controller import GatesRefused, RolloutController, RolloutError
from kvmigrate.rollout.store import StoreError


class RolloutClient(Protocol):
    def status(self) -> dict[str, Any]: ...
    def history(self, limit: int = 100) -> list[dict[str, Any]]: ...
    def set_percent(self, percent: float, reason: str, force: bool) -> dict[str, Any]: ...
    def set_mode(self, mode: str, reason: str) -> dict[str, Any]: ...
    def rollback(self, reason: str) -> dict[str, Any]: ...


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


class LocalRollout:
    def __init__(self, controller: RolloutController, actor: str | None = None) -> None:
        self.controller = controller
        self.actor = actor or default_actor()

    def status(self) -> dict[str, Any]:
        return self.controller.status()

    def history(self, limit: int = 100) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.controller.store.history(limit)]

    def set_percent(self, percent: float, reason: str, force: bool) -> dict[str, Any]:
        return self.controller.set_percent(percent, reason, self.actor, force).to_dict()

    def set_mode(self, mode: str, reason: str) -> dict[str, Any]:
        return self.controller.set_mode(mode, reason, self.actor).to_dict()

    def rollback(self, reason: str) -> dict[str, Any]:
        return self.controller.rollback(reason, self.actor).to_dict()


class RemoteRollout:
    def __init__(
        self, proxy_url: str, admin_key: str | None, actor: str | None = None, timeout: float = 30.0
    ) -> None:
        self.base = proxy_url.rstrip("/").removesuffix("/v1")
        self.admin_key = admin_key
        self.actor = actor or default_actor()
        self.timeout = timeout

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/admin/rollout")

    def history(self, limit: int = 100) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self._call("GET", f"/admin/rollout/history?limit={limit}")[
            "events"
        ]
        return events

    def set_percent(self, percent: float, reason: str, force: bool) -> dict[str, Any]:
        return self._call(
            "POST",
            "/admin/rollout",
            {"percent": percent, "reason": reason, "force": force, "actor": self.actor},
        )

    def set_mode(self, mode: str, reason: str) -> dict[str, Any]:
        return self._call(
            "POST", "/admin/rollout", {"mode": mode, "reason": reason, "actor": self.actor}
        )

    def rollback(self, reason: str) -> dict[str, Any]:
        return self._call("POST", "/admin/rollback", {"reason": reason, "actor": self.actor})

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.admin_key:
            headers["Authorization"] = "Bearer " + self.admin_key
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + path, data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                result: dict[str, Any] = json.loads(response.read())
                return result
        except urllib.error.HTTPError as exc:
            raise _remote_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise StoreError(f"cannot reach the proxy at {self.base}: {exc}") from None


def _remote_error(exc: urllib.error.HTTPError) -> Exception:
    try:
        payload = json.loads(exc.read())
        message = payload["error"]["message"]
    except (ValueError, KeyError, TypeError):
        payload, message = {}, f"HTTP {exc.code}"
    if payload.get("gates"):
        results = [
            GateResult(g["name"], Verdict(g["verdict"]), g["detail"], g["figures"])
            for g in payload["gates"]
        ]
        refused = GatesRefused(0.0, results)
        refused.args = (message,)
        return refused
    if exc.code == 503:
        return StoreError(f"the proxy's rollout store is unavailable: {message}")
    return RolloutError(f"the proxy refused ({exc.code}): {message}")
