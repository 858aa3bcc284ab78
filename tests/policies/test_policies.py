"""Routing policies are pure functions: tested as tables, with no server."""

from __future__ import annotations

import pytest

from kvmigrate.policies import (
    Decision,
    RolloutSnapshot,
    bucket,
    conversation_key,
    decide,
    in_candidate_share,
    in_shadow_sample,
    turn_index,
)

SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER1 = {"role": "user", "content": "Fix the failing test."}
ANSWER1 = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1"}]}
TOOL1 = {"role": "tool", "tool_call_id": "call_1", "content": "ok"}


def snapshot(
    mode: str = "split", percent: float = 50, shadow_sample: float = 1.0, fallback: bool = True
) -> RolloutSnapshot:
    return RolloutSnapshot("hosted", "vllm", mode, percent, shadow_sample, "salt", fallback)


@pytest.mark.parametrize(
    ("headers", "body", "source"),
    [
        ({"x-session-id": "s-1"}, {"user": "u", "messages": [USER1]}, "header"),
        ({}, {"user": "u", "messages": [USER1]}, "user"),
        ({}, {"messages": [SYSTEM, USER1]}, "prefix"),
        ({}, {"input": "embed me"}, "body"),
        ({}, {"user": "", "messages": [USER1]}, "prefix"),
    ],
)
def test_conversation_key_sources(
    headers: dict[str, str], body: dict[str, object], source: str
) -> None:
    assert conversation_key(headers, body, "m").source == source


def test_conversation_key_is_stable_across_turns() -> None:
    turn1 = {"messages": [SYSTEM, USER1]}
    turn2 = {"messages": [SYSTEM, USER1, ANSWER1, TOOL1]}
    turn3 = {
        "messages": [
            SYSTEM,
            USER1,
            ANSWER1,
            TOOL1,
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "and now?"},
        ]
    }
    keys = {conversation_key({}, body, "m").value for body in (turn1, turn2, turn3)}
    assert len(keys) == 1


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"messages": [SYSTEM, USER1]}, {"messages": [SYSTEM, {"role": "user", "content": "hi"}]}),
        ({"messages": [SYSTEM, USER1]}, {"messages": [USER1]}),
        ({"messages": [USER1]}, {"messages": [USER1], "model": "other"}),
    ],
)
def test_different_conversations_get_different_keys(
    a: dict[str, object], b: dict[str, object]
) -> None:
    model_b = str(b.get("model", "m"))
    assert conversation_key({}, a, "m").value != conversation_key({}, b, model_b).value


@pytest.mark.parametrize(
    ("messages", "turn"),
    [
        ([USER1], 1),
        ([SYSTEM, USER1, ANSWER1, TOOL1], 2),
        (
            [
                SYSTEM,
                USER1,
                ANSWER1,
                TOOL1,
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": "more"},
            ],
            3,
        ),
    ],
)
def test_turn_index(messages: list[dict[str, object]], turn: int) -> None:
    assert turn_index({"messages": messages}) == turn


def test_buckets_are_uniform_enough() -> None:
    buckets = [bucket("salt", f"conv-{i}") for i in range(20_000)]
    assert all(0 <= b < 10_000 for b in buckets)
    share = sum(b < 1000 for b in buckets) / len(buckets)
    assert 0.09 < share < 0.11


def test_split_is_monotone_in_percent() -> None:
    keys = [f"conv-{i}" for i in range(5000)]
    previous: set[str] = set()
    for percent in (0, 1, 10, 25, 50, 75, 100):
        chosen = {k for k in keys if in_candidate_share("salt", k, percent)}
        assert previous <= chosen, f"a conversation left the candidate at {percent}%"
        assert abs(len(chosen) / len(keys) - percent / 100) < 0.03
        previous = chosen
    assert len(previous) == len(keys)


def test_salt_changes_membership() -> None:
    keys = [f"conv-{i}" for i in range(2000)]
    a = {k for k in keys if in_candidate_share("a", k, 50)}
    b = {k for k in keys if in_candidate_share("b", k, 50)}
    assert a != b


def test_shadow_sample_is_independent_of_split() -> None:
    keys = [f"conv-{i}" for i in range(4000)]
    split = {k for k in keys if in_candidate_share("salt", k, 50)}
    shadow = {k for k in keys if in_shadow_sample("salt", k, 0.5)}
    overlap = len(split & shadow) / len(keys)
    assert 0.2 < overlap < 0.3  # about 0.5 * 0.5 when independent


@pytest.mark.parametrize(
    ("snap", "candidate_serves", "expected"),
    [
        (snapshot("shadow", 0, 1.0), True, Decision("hosted", shadow="vllm")),
        (snapshot("shadow", 100, 0.0), True, Decision("hosted")),
        (snapshot("shadow", 0, 1.0), False, Decision("hosted")),
        (snapshot("split", 100), True, Decision("vllm", fallback="hosted")),
        (snapshot("split", 100, fallback=False), True, Decision("vllm")),
        (snapshot("split", 0), True, Decision("hosted", shadow="vllm")),
        (snapshot("split", 0, shadow_sample=0.0), True, Decision("hosted")),
        (snapshot("split", 100), False, Decision("hosted")),
    ],
)
def test_decide_table(snap: RolloutSnapshot, candidate_serves: bool, expected: Decision) -> None:
    assert decide("conv-1", snap, candidate_serves) == expected


def test_decide_is_sticky_for_a_conversation() -> None:
    snap = snapshot("split", 50)
    for i in range(200):
        key = f"conv-{i}"
        assert len({decide(key, snap, True) for _ in range(5)}) == 1


@pytest.mark.parametrize(
    ("pin", "snap", "epoch", "expected"),
    [
        (None, snapshot("split", 50), 0, Decision("vllm", fallback="hosted")),
        (("hosted", 0, 1e12), snapshot("split", 50), 0, Decision("hosted", shadow="vllm")),
        (("hosted", 0, 1e12), snapshot("split", 50, shadow_sample=0), 0, Decision("hosted")),
        (("vllm", 0, 1e12), snapshot("split", 10), 0, Decision("vllm", fallback="hosted")),
        # after a rollback (epoch 1) a candidate pin no longer holds
        (("vllm", 0, 1e12), snapshot("split", 10), 1, Decision("hosted", shadow="vllm")),
        (None, snapshot("split", 10), 0, Decision("hosted", shadow="vllm")),
        # a candidate pin does not hold at 0%
        (("vllm", 0, 1e12), snapshot("split", 0), 0, Decision("hosted", shadow="vllm")),
        # expired pins and shadow mode are ignored
        (("hosted", 0, 1.0), snapshot("split", 50), 0, Decision("vllm", fallback="hosted")),
        (("vllm", 0, 1e12), snapshot("shadow", 0), 0, Decision("hosted", shadow="vllm")),
    ],
)
def test_pins(
    pin: tuple[str, int, float] | None, snap: RolloutSnapshot, epoch: int, expected: Decision
) -> None:
    from kvmigrate.policies.pinning import PinView, pinned_decision

    # A conversation inside the 50% share but outside the 10% one.
    key = next(f"c{i}" for i in range(10_000) if 1000 <= bucket("salt", f"c{i}") < 5000)
    base = decide(key, snap, True)
    view = PinView(*pin) if pin else None
    assert pinned_decision(base, view, snap, epoch, now=1000.0, conversation=key) == expected
