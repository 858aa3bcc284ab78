"""One interface for the rollout commands, whether they talk to the store or to a proxy.

`LocalRollout` drives the controller over the configured store; `RemoteRollout` drives a
running proxy's /admin/rollout API and decodes its answers into the same types
(`kvmigrate.rollout.api`). Both raise `RolloutError` (or `GatesRefused`) for a refused change.
"""

from __future__ import annotations

import getpass
import math
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Protocol, TypeVar

import msgspec

from kvmigrate.config import safe_text, safe_url
from kvmigrate.policies.modes import Mode
from kvmigrate.rollout.api import (
    CohortStatuses,
    Refusal,
    RollbackRequest,
    RolloutChange,
    RolloutHistory,
)
from kvmigrate.rollout.controller import (
    ChangeOutcome,
    GatesRefused,
    RolloutController,
    RolloutError,
    RolloutStatus,
)
from kvmigrate.rollout.state import RolloutEvent
from kvmigrate.rollout.store import StoreError

T = TypeVar("T")


class EndpointMissing(RolloutError):
    """The proxy has no such admin endpoint: a release that predates it."""


class RolloutClient(Protocol):
    """Bound to one cohort (None: the config's only one), except `statuses`, which lists
    every cohort, and `history`, which without a cohort shows every cohort's changes."""

    def status(self) -> RolloutStatus: ...
    def statuses(self) -> list[RolloutStatus]: ...
    def history(self, limit: int = 100) -> list[RolloutEvent]: ...
    def set_percent(
        self, percent: float, reason: str, force: bool, expected_version: int | None = None
    ) -> ChangeOutcome: ...
    def set_mode(self, mode: Mode, reason: str) -> ChangeOutcome: ...
    def change(
        self, percent: float | None, mode: Mode | None, reason: str, force: bool
    ) -> ChangeOutcome: ...
    def rollback(self, reason: str) -> ChangeOutcome: ...


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


class LocalRollout:
    def __init__(
        self,
        controller: RolloutController,
        actor: str | None = None,
        cohort: str | None = None,
        candidate: str | None = None,
    ) -> None:
        self.controller = controller
        self.actor = actor or default_actor()
        self.cohort = cohort
        self.candidate = candidate

    def status(self) -> RolloutStatus:
        return self.controller.status(self.cohort)

    def statuses(self) -> list[RolloutStatus]:
        return self.controller.statuses()

    def history(self, limit: int = 100) -> list[RolloutEvent]:
        return self.controller.history(limit, self.cohort)

    def set_percent(
        self, percent: float, reason: str, force: bool, expected_version: int | None = None
    ) -> ChangeOutcome:
        return self.controller.set_percent(
            percent, reason, self.actor, force, self.cohort, self.candidate, expected_version
        )

    def set_mode(self, mode: Mode, reason: str) -> ChangeOutcome:
        return self.controller.set_mode(mode, reason, self.actor, self.cohort)

    def change(
        self, percent: float | None, mode: Mode | None, reason: str, force: bool
    ) -> ChangeOutcome:
        return self.controller.change(
            percent, mode, reason, self.actor, force, self.cohort, self.candidate
        )

    def rollback(self, reason: str) -> ChangeOutcome:
        return self.controller.rollback(reason, self.actor, cohort=self.cohort)


class RemoteRollout:
    def __init__(
        self,
        proxy_url: str,
        admin_key: str | None,
        actor: str | None = None,
        timeout: float = 30.0,
        cohort: str | None = None,
        candidate: str | None = None,
    ) -> None:
        self.base = proxy_url.rstrip("/").removesuffix("/v1")
        self.admin_key = admin_key
        self.actor = actor or default_actor()
        self.timeout = timeout
        self.cohort = cohort
        self.candidate = candidate

    def _query(self, **params: object) -> str:
        if self.cohort is not None:
            params["cohort"] = self.cohort
        return "?" + urllib.parse.urlencode(params) if params else ""

    def status(self) -> RolloutStatus:
        return self._call("GET", "/admin/rollout" + self._query(), RolloutStatus)

    def statuses(self) -> list[RolloutStatus]:
        return self._call("GET", "/admin/rollout/cohorts", CohortStatuses).cohorts

    def history(self, limit: int = 100) -> list[RolloutEvent]:
        path = "/admin/rollout/history" + self._query(limit=limit)
        return self._call("GET", path, RolloutHistory).events

    def set_percent(
        self, percent: float, reason: str, force: bool, expected_version: int | None = None
    ) -> ChangeOutcome:
        return self._change(percent, None, reason, force, expected_version)

    def set_mode(self, mode: Mode, reason: str) -> ChangeOutcome:
        return self._change(None, mode, reason, False, None)

    def change(
        self, percent: float | None, mode: Mode | None, reason: str, force: bool
    ) -> ChangeOutcome:
        return self._change(percent, mode, reason, force, None)

    def _change(
        self,
        percent: float | None,
        mode: Mode | None,
        reason: str,
        force: bool,
        expected_version: int | None,
    ) -> ChangeOutcome:
        if percent is not None and not math.isfinite(percent):
            # JSON has no NaN: it would travel as null, and the proxy read "no percent"
            raise RolloutError(f"percent must be a number between 0 and 100, got {percent}")
        change = RolloutChange(
            percent=percent,
            mode=mode,
            reason=reason,
            force=force,
            actor=self.actor,
            cohort=self.cohort,
            candidate=self.candidate if percent is not None else None,
            expected_version=expected_version,
        )
        return self._call("POST", "/admin/rollout", ChangeOutcome, change)

    def rollback(self, reason: str) -> ChangeOutcome:
        request = RollbackRequest(reason=reason, actor=self.actor, cohort=self.cohort)
        return self._call("POST", "/admin/rollback", ChangeOutcome, request)

    def _call(self, method: str, path: str, answer: type[T], body: object = None) -> T:
        headers = {"Content-Type": "application/json"}
        if self.admin_key:
            headers["Authorization"] = "Bearer " + self.admin_key
        data = msgspec.json.encode(body) if body is not None else None
        request = urllib.request.Request(
            self.base + path, data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _remote_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            problem = safe_text(f"cannot reach the proxy at {self.base}: {exc}")
            raise StoreError(problem) from None
        try:
            return msgspec.json.decode(raw, type=answer)
        except msgspec.DecodeError as exc:
            problem = f"the proxy at {safe_url(self.base)} answered {path} unexpectedly: {exc}"
            raise RolloutError(problem) from None


def _remote_error(exc: urllib.error.HTTPError) -> Exception:
    try:
        refusal = msgspec.json.decode(exc.read(), type=Refusal)
        message, gates = refusal.error.message, refusal.gates
    except msgspec.DecodeError:
        message, gates = f"HTTP {exc.code}", []
    if exc.code == 404:  # the admin API never answers 404 itself
        return EndpointMissing(f"{safe_url(exc.url)} answered 404 ({message})")
    if gates:
        refused = GatesRefused(0.0, gates)
        refused.args = (message,)
        return refused
    if exc.code == 503:
        return StoreError(f"the proxy's rollout store is unavailable: {message}")
    return RolloutError(f"the proxy refused ({exc.code}): {message}")
