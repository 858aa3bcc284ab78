"""Conversation pins: a conversation stays on the backend that served its first turn.

With pins, raising the percent moves only new conversations, so a conversation never
loses its warm prefix cache halfway. A rollback bumps the rollout's epoch, and a pin to
the candidate from an older epoch stops holding: pulling a bad candidate out must move
its conversations too.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmigrate.policies.decision import Decision, RolloutSnapshot
from kvmigrate.policies.split import in_shadow_sample


@dataclass(frozen=True, slots=True)
class PinView:
    backend: str
    epoch: int
    expires_at: float


def pinned_decision(
    decision: Decision,
    pin: PinView | None,
    snapshot: RolloutSnapshot,
    epoch: int,
    now: float,
    conversation: str = "",
) -> Decision:
    """The decision once the conversation's pin, if it still holds, is applied."""
    if pin is None or snapshot.mode != "split" or pin.expires_at < now:
        return decision
    if pin.backend == snapshot.primary:
        shadowed = in_shadow_sample(snapshot.salt, conversation, snapshot.shadow_sample)
        return Decision(serve=snapshot.primary, shadow=snapshot.candidate if shadowed else None)
    if pin.backend == snapshot.candidate and pin.epoch == epoch and snapshot.percent > 0:
        return Decision(
            serve=snapshot.candidate, fallback=snapshot.primary if snapshot.fallback else None
        )
    return decision


def should_pin(decision: Decision, snapshot: RolloutSnapshot) -> bool:
    """Pins are made in split mode only: in shadow mode the primary serves everyone."""
    return snapshot.mode == "split" and decision.serve in (snapshot.primary, snapshot.candidate)
