"""`policies.route`: the one routing step, tested as tables with no server."""

from __future__ import annotations

import pytest

from kvmigrate.policies import (
    RolloutSnapshot,
    bucket,
    in_shadow_sample,
    route,
    serve_without_conversation,
)
from kvmigrate.policies.pinning import PinView
from kvmigrate.policies.split import in_noise_sample

BOTH = ("hosted", "vllm")


def snap(
    mode: str = "split",
    percent: float = 50,
    shadow_sample: float = 1.0,
    noise_sample: float = 0.0,
    epoch: int = 0,
    fallback: bool = True,
) -> RolloutSnapshot:
    return RolloutSnapshot(
        "hosted", "vllm", mode, percent, shadow_sample, "salt", fallback, noise_sample, epoch
    )


# A conversation inside the 50% share but outside the 10% one.
KEY = next(f"c{i}" for i in range(10_000) if 1000 <= bucket("salt", f"c{i}") < 5000)
LIVE = 1e12  # a pin that has not expired


@pytest.mark.parametrize(
    ("snapshot", "served", "pin", "expected"),
    [
        # only the candidate serves the model: it answers, nothing to shadow or fall back to
        (snap("shadow", 0), ("vllm",), None, ("vllm", None, None, False)),
        (snap("split", 0), ("vllm",), None, ("vllm", None, None, False)),
        # only the primary serves it
        (snap("split", 100), ("hosted",), None, ("hosted", None, None, True)),
        (snap("shadow", 0), ("hosted",), None, ("hosted", None, None, False)),
        # a pin to the primary must not shadow to a candidate that does not serve the model
        (snap("split", 50), ("hosted",), PinView("hosted", 0, LIVE), ("hosted", None, None, False)),
        # the split and the shadow sample
        (snap("shadow", 0), BOTH, None, ("hosted", "vllm", None, False)),
        (snap("split", 50), BOTH, None, ("vllm", None, "hosted", True)),
        (snap("split", 10), BOTH, None, ("hosted", "vllm", None, True)),
        (snap("split", 10, shadow_sample=0), BOTH, None, ("hosted", None, None, True)),
        (snap("split", 50, fallback=False), BOTH, None, ("vllm", None, None, True)),
        # pins hold and are not made again
        (snap("split", 50), BOTH, PinView("hosted", 0, LIVE), ("hosted", "vllm", None, False)),
        (snap("split", 10), BOTH, PinView("vllm", 0, LIVE), ("vllm", None, "hosted", False)),
        # a rollback bumps the snapshot's epoch: an older candidate pin no longer holds
        (
            snap("split", 10, epoch=1),
            BOTH,
            PinView("vllm", 0, LIVE),
            ("hosted", "vllm", None, False),
        ),
        # an expired pin is ignored
        (snap("split", 10), BOTH, PinView("vllm", 0, 1.0), ("hosted", "vllm", None, False)),
    ],
)
def test_route_table(
    snapshot: RolloutSnapshot,
    served: tuple[str, ...],
    pin: PinView | None,
    expected: tuple[str, str | None, str | None, bool],
) -> None:
    chosen = route(KEY, snapshot, served, pin, now=1000.0)
    assert (chosen.serve, chosen.shadow, chosen.fallback, chosen.pin) == expected
    assert chosen.snapshot is snapshot


def test_the_noise_sample_is_a_share_of_the_shadowed_conversations() -> None:
    snapshot = snap("shadow", 0, shadow_sample=1.0, noise_sample=0.25)
    keys = [f"conv-{i}" for i in range(4000)]
    noisy = {k for k in keys if route(k, snapshot, BOTH).noise}
    assert noisy == {k for k in keys if in_noise_sample("salt", k, 0.25)}
    assert 0.2 < len(noisy) / len(keys) < 0.3
    # its own sample: independent of the shadow sample at the same share
    shadowed = {k for k in keys if in_shadow_sample("salt", k, 0.25)}
    assert 0.03 < len(noisy & shadowed) / len(keys) < 0.1


@pytest.mark.parametrize(
    ("snapshot", "served"),
    [
        (snap("shadow", 0, shadow_sample=0.0, noise_sample=1.0), BOTH),  # not shadowed
        (snap("split", 100, noise_sample=1.0), BOTH),  # served by the candidate
        (snap("split", 0, noise_sample=1.0), ("hosted",)),  # no candidate for the model
    ],
)
def test_no_noise_sample_without_a_shadow_copy(
    snapshot: RolloutSnapshot, served: tuple[str, ...]
) -> None:
    assert route(KEY, snapshot, served).noise is False


def test_route_is_sticky_and_carries_its_snapshot() -> None:
    snapshot = snap("split", 50, noise_sample=0.5)
    for i in range(200):
        routes = {route(f"conv-{i}", snapshot, BOTH) for _ in range(3)}
        assert len(routes) == 1


def test_route_names_the_roles_of_its_snapshot() -> None:
    chosen = route(KEY, snap("split", 50), BOTH)
    assert chosen.is_candidate("vllm")
    assert not chosen.is_candidate("hosted")
    assert chosen.is_primary("hosted")
    assert not chosen.is_primary("vllm")
    assert (chosen.serve, chosen.shadow, chosen.fallback) == ("vllm", None, "hosted")


@pytest.mark.parametrize(
    ("snapshot", "served", "expected"),
    [
        # shadow mode: the primary answers everyone, whatever the sample
        (snap("shadow", 0), BOTH, "hosted"),
        (snap("shadow", 0, shadow_sample=0), BOTH, "hosted"),
        # only one backend serves the model: it answers everyone, in either mode
        (snap("shadow", 0), ("vllm",), "vllm"),
        (snap("split", 50), ("vllm",), "vllm"),
        (snap("split", 50), ("hosted",), "hosted"),
        # a split at 0%: no share, and no pin to the candidate holds
        (snap("split", 0), BOTH, "hosted"),
        (snap("split", 0, epoch=3), BOTH, "hosted"),
        # a split with a share: the conversation, and its pin, decide
        (snap("split", 1), BOTH, None),
        (snap("split", 50), BOTH, None),
        (snap("split", 100), BOTH, None),
    ],
)
def test_the_backend_known_before_the_conversation(
    snapshot: RolloutSnapshot, served: tuple[str, ...], expected: str | None
) -> None:
    """What the proxy may send before it identifies the conversation is what `route` gives
    every conversation, pinned or not."""
    assert serve_without_conversation(snapshot, served) == expected
    if expected is None:
        return
    pins = (None, PinView("hosted", 0, LIVE), PinView("vllm", 0, LIVE))
    served_by = {
        route(f"c{i}", snapshot, served, pin, 0.0).serve for i in range(300) for pin in pins
    }
    assert served_by == {expected}
