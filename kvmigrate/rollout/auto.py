"""`kvmigrate rollout auto`: walk the steps with a bake time each, as Argo Rollouts does.

At each step the gates must pass on the evidence gathered at the current one. While the
evidence is still too thin (Inconclusive), it waits, looking again every poll; a Failed
gate rolls back and stops; a change made by someone else during a bake or a wait (an
auto-rollback in a proxy) stops the walk: every promotion is conditional on the state
version the walk last saw, so it never overrides such a change. Looking every few seconds
is safe: the gates decide on always-valid intervals (`policies.sequential`), which hold at
every look at once, so the number of polls does not raise the chance of a false pass or a
false alarm.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.policies.gates import GateResult, Verdict
from kvmigrate.rollout.client import RolloutClient
from kvmigrate.rollout.controller import GatesRefused, RolloutError, RolloutStatus, effective_share


@dataclass
class AutoResult:
    completed: bool
    reached: float
    message: str
    steps: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "reached": self.reached,
            "message": self.message,
            "steps": self.steps,
        }


@dataclass(frozen=True)
class AutoSettings:
    bake_seconds: float
    step_timeout: float = 3600.0
    poll_seconds: float = 5.0


def auto_rollout(
    client: RolloutClient,
    settings: AutoSettings,
    echo: Callable[[str], None] = lambda _m: None,
    sleep: Callable[[float], None] = time.sleep,
) -> AutoResult:
    status = client.status()
    result = AutoResult(False, _percent(status), "")
    seen = status.state.version
    for step in [s for s in status.steps if s > _percent(status)]:
        promoted = _promote(client, step, seen, settings, echo, sleep, result)
        if isinstance(promoted, str):
            result.message = promoted
            return result
        seen = promoted
        result.reached = step
        echo(f"at {step:g}%: baking for {settings.bake_seconds:g}s")
        interrupted = _bake(client, seen, settings, sleep)
        if interrupted is not None:
            result.message = interrupted
            return result
    result.completed = True
    result.message = f"rollout complete at {result.reached:g}%"
    return result


def _promote(
    client: RolloutClient,
    step: float,
    seen: int,
    settings: AutoSettings,
    echo: Callable[[str], None],
    sleep: Callable[[float], None],
    result: AutoResult,
) -> int | str:
    """Promote to `step`, from the state at version `seen`, once the gates allow it: the
    new version, or the reason it stopped."""
    deadline = time.monotonic() + settings.step_timeout
    while True:
        try:
            change = client.set_percent(step, f"rollout auto: step {step:g}%", False, seen)
        except GatesRefused as refused:
            failed = [g for g in refused.results if g.verdict == Verdict.FAILED]
            if failed:
                result.steps.append({"step": step, "gates": [g.to_dict() for g in refused.results]})
                if result.reached > 0:
                    client.rollback(f"rollout auto: gates failed before {step:g}%")
                return f"gates failed before {step:g}%: " + "; ".join(
                    f"{g.name}: {g.detail}" for g in failed
                )
            if time.monotonic() > deadline:
                result.steps.append({"step": step, "gates": [g.to_dict() for g in refused.results]})
                return f"gave up on {step:g}%: the evidence stayed inconclusive" + _asked(
                    refused.results
                )
            echo(
                f"waiting for evidence before {step:g}%: "
                + "; ".join(g.detail for g in refused.results if g.verdict != Verdict.PASSED)
            )
            sleep(settings.poll_seconds)
            continue
        except RolloutError:
            # Refused: the state moved on? (through a proxy's API that is only said in words)
            stopped = _changed_since(client, seen, f"while waiting to promote to {step:g}%")
            if stopped is None:
                raise
            return stopped
        result.steps.append({"step": step, "gates": [g.to_dict() for g in change.gates]})
        echo(f"promoted to {step:g}% (version {change.state.version})")
        return change.state.version


def _asked(results: list[GateResult]) -> str:
    """What the waiting gates said they still need, the most of them."""
    needed = [g.needed_conversations for g in results if g.verdict == Verdict.INCONCLUSIVE]
    most = max((n for n in needed if n is not None), default=None)
    if most is None:
        return ""
    return f" (the gates asked for about {most} more conversations; --step-timeout waits longer)"


def _bake(
    client: RolloutClient, seen: int, settings: AutoSettings, sleep: Callable[[float], None]
) -> str | None:
    """Wait out the bake at the state of version `seen`; the reason it stopped, if it did."""
    end = time.monotonic() + settings.bake_seconds
    while True:
        stopped = _changed_since(client, seen, "during the bake")
        if stopped is not None or time.monotonic() >= end:
            return stopped
        sleep(min(settings.poll_seconds, max(0.0, end - time.monotonic())))


def _changed_since(client: RolloutClient, seen: int, when: str) -> str | None:
    """Why the walk stops when the state is no longer version `seen`: someone else's change
    (a rollback by hand or by a proxy) stands over the walk's plan."""
    if client.status().state.version == seen:
        return None
    history = client.history(1)
    action, reason = (history[-1].action, history[-1].reason) if history else ("?", "")
    return f"stopped: the rollout changed {when} ({action}: {reason})"


def _percent(status: RolloutStatus) -> float:
    return effective_share(status.state.mode, status.state.percent)
