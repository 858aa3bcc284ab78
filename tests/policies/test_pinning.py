"""Pins at their edges: the instant a pin expires, a fractional percent, fallback off, and the
shadow sample of a conversation pinned to the primary (its own conversation, not another's)."""

from __future__ import annotations

import pytest

from kvmigrate.policies.decision import Decision, RolloutSnapshot, decide
from kvmigrate.policies.pinning import PinView, pinned_decision
from kvmigrate.policies.route import route
from kvmigrate.policies.split import in_shadow_sample

NOW = 1_000.0
UNPINNED = Decision(serve="unpinned")


def snapshot(**overrides: object) -> RolloutSnapshot:
    fields: dict[str, object] = {
        "primary": "hosted", "candidate": "vllm", "mode": "split", "percent": 50.0,
        "shadow_sample": 0.0, "salt": "s", "fallback": True, "epoch": 2,
    }  # fmt: skip
    fields.update(overrides)
    return RolloutSnapshot(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pin", "snap", "expected"),
    [
        (PinView("vllm", 2, NOW), snapshot(), Decision("vllm", fallback="hosted")),  # expires now: holds
        (PinView("vllm", 2, NOW - 0.001), snapshot(), UNPINNED),  # expired
        (PinView("vllm", 2, NOW + 9), snapshot(percent=0.5), Decision("vllm", fallback="hosted")),
        (PinView("vllm", 2, NOW + 9), snapshot(percent=0.0), UNPINNED),  # the candidate is out
        (PinView("vllm", 2, NOW + 9), snapshot(fallback=False), Decision("vllm")),
        (PinView("vllm", 1, NOW + 9), snapshot(), UNPINNED),  # pinned before a rollback
        (PinView("vllm", 2, NOW + 9), snapshot(mode="shadow"), UNPINNED),
        (PinView("hosted", 0, NOW + 9), snapshot(), Decision("hosted")),
        (PinView("other", 2, NOW + 9), snapshot(), UNPINNED),
        (None, snapshot(), UNPINNED),
    ],
)  # fmt: skip
def test_pin_table(pin: PinView | None, snap: RolloutSnapshot, expected: Decision) -> None:
    assert pinned_decision(UNPINNED, pin, snap, 2, NOW, "c") == expected


def test_a_conversation_pinned_to_the_primary_keeps_its_own_shadow_sample() -> None:
    snap = snapshot(shadow_sample=0.5)
    names = [f"conversation {i}" for i in range(40)]
    sampled = {n for n in names if in_shadow_sample("s", n, 0.5)}
    assert 0 < len(sampled) < len(names)
    pin = PinView("hosted", 0, NOW + 9)
    for name in names:
        decision = pinned_decision(UNPINNED, pin, snap, 2, NOW, name)
        assert decision == Decision("hosted", shadow="vllm" if name in sampled else None)


def test_route_and_decide_sample_each_conversation_by_its_own_key() -> None:
    """Through `route` (pinned to the primary, or not pinned at all) and `decide`, the shadow
    copy follows the conversation's own sample: some are shadowed, the rest are not."""
    snap = snapshot(shadow_sample=0.5, percent=0.0)
    names = [f"conversation {i}" for i in range(40)]
    sampled = {n for n in names if in_shadow_sample("s", n, 0.5)}
    assert 0 < len(sampled) < len(names)
    pin = PinView("hosted", 0, NOW + 9)
    for name in names:
        expected = "vllm" if name in sampled else None
        assert decide(name, snap, True).shadow == expected
        assert route(name, snap, {"hosted", "vllm"}, pin, NOW).shadow == expected
        assert route(name, snap, {"hosted", "vllm"}).shadow == expected
