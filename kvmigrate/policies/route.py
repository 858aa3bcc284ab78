"""`route()`: the one routing step every entry point takes (the proxy, the LiteLLM plugin).

It composes the pure parts: the model served by only one backend, the sticky split and the
shadow sample (`decide`), the conversation's pin (`pinned_decision`), and the noise sample.
The caller brings what needs I/O (the snapshot, the pin it looked up) and acts on the result:
it makes the pin `Route.pin` asks for, and takes the noise budget before a noise copy.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from kvmigrate.policies.decision import RolloutSnapshot, decide
from kvmigrate.policies.pinning import PinView, pinned_decision, should_pin
from kvmigrate.policies.split import in_noise_sample


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes, under the snapshot it was decided with.

    `noise`: a shadowed conversation that also asks its primary a second time, so parity can
    subtract how much the primary disagrees with itself (budget permitting).
    `pin`: the conversation had no pin and should now be pinned to `serve`.
    """

    snapshot: RolloutSnapshot
    serve: str
    shadow: str | None = None
    fallback: str | None = None
    noise: bool = False
    pin: bool = False

    def is_candidate(self, backend: str) -> bool:
        return backend == self.snapshot.candidate or backend in self.snapshot.extra_shadows

    def extra_shadows(self, served: Collection[str]) -> tuple[str, ...]:
        """The further candidates that get a copy of this request: those serving its model,
        when the request is shadowed at all."""
        if self.shadow is None:
            return ()
        return tuple(c for c in self.snapshot.extra_shadows if c in served)

    def is_primary(self, backend: str) -> bool:
        return backend == self.snapshot.primary


def route(
    conversation: str,
    snapshot: RolloutSnapshot,
    served: Collection[str],
    pin: PinView | None = None,
    now: float = 0.0,
) -> Route:
    """Route one request of `conversation` for a model the backends in `served` serve.

    Pure: the same inputs always give the same answer. `pin` is the conversation's pin, if
    the caller keeps pins and found one; `now` is the time its expiry is judged at.
    """
    if snapshot.primary not in served:
        # Only the candidate serves this model: nothing to split, shadow or fall back to.
        return Route(snapshot, serve=snapshot.candidate)
    candidate_serves = snapshot.candidate in served
    decision = decide(conversation, snapshot, candidate_serves)
    if pin is not None and candidate_serves:
        decision = pinned_decision(decision, pin, snapshot, snapshot.epoch, now, conversation)
    noise = decision.shadow is not None and in_noise_sample(
        snapshot.salt, conversation, snapshot.noise_sample
    )
    return Route(
        snapshot,
        decision.serve,
        decision.shadow,
        decision.fallback,
        noise=noise,
        pin=pin is None and should_pin(decision, snapshot),
    )


def serve_without_conversation(snapshot: RolloutSnapshot, served: Collection[str]) -> str | None:
    """The backend `route` serves every conversation of a model with under `snapshot`, when
    no conversation can change it (None: a split that gives the candidate a share, where the
    conversation and its pin decide; at 0% no pin to the candidate holds). The proxy sends
    such a request before it identifies the conversation."""
    if snapshot.primary not in served:
        return snapshot.candidate
    if snapshot.mode != "split" or snapshot.candidate not in served or snapshot.percent <= 0:
        return snapshot.primary
    return None
