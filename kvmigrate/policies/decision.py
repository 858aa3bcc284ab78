"""`decide()`: which backend answers, which gets a shadow copy, where a failure falls back."""

from __future__ import annotations

from dataclasses import dataclass

from kvmigrate.policies.split import in_candidate_share, in_shadow_sample


@dataclass(frozen=True, slots=True)
class RolloutSnapshot:
    """The rollout state the proxy routes by; replaced whole when the state changes."""

    primary: str
    candidate: str
    mode: str  # "shadow" | "split" | "observe"
    percent: float
    shadow_sample: float
    salt: str
    fallback: bool = True
    noise_sample: float = 0.0
    # Grows with every rollback: a pin to the candidate from an older epoch stops holding.
    epoch: int = 0
    # Further candidates: each gets its own copy of what `shadow` shadows.
    extra_shadows: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    serve: str
    shadow: str | None = None
    fallback: str | None = None


def decide(
    conversation: str,
    snapshot: RolloutSnapshot,
    candidate_serves_model: bool,
) -> Decision:
    """Route one request of `conversation`. Pure: the same inputs always give the same answer."""
    primary, candidate = snapshot.primary, snapshot.candidate
    if not candidate_serves_model or snapshot.mode == "observe":
        return Decision(serve=primary)
    if snapshot.mode == "split" and in_candidate_share(
        snapshot.salt, conversation, snapshot.percent
    ):
        return Decision(serve=candidate, fallback=primary if snapshot.fallback else None)
    # The primary's conversations stay shadowed in split mode too, so parity and TTFT
    # evidence keeps coming for the next step's gates (shadow_sample sets the cost).
    if in_shadow_sample(snapshot.salt, conversation, snapshot.shadow_sample):
        return Decision(serve=primary, shadow=candidate)
    return Decision(serve=primary)
