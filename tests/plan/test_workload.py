"""Loading the traffic a plan replays: the records store and the two JSONL formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmigrate.plan.dataset import from_jsonl
from kvmigrate.plan.sweep import parse_sizes
from kvmigrate.plan.workload import from_store, pace, scaled
from kvmigrate.recorder import Record, open_store


def record(n: int, conversation: str, turn: int, ts: float, prompt: int | None) -> Record:
    return Record(
        request_id=f"r{n}", ts=ts, route="chat/completions", backend="hosted", role="serve",
        model="m", served_model="m", conversation=conversation, turn=turn, stream=True,
        status=200, ttft_ms=50.0, latency_ms=1000.0, prompt_tokens=prompt, cached_tokens=0,
        completion_tokens=20,
    )  # fmt: skip


def test_records_become_timed_turns_with_think_times(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path}/r.db") as store:
        store.insert(
            [
                record(1, "a", 1, 100.0, 500),
                record(2, "b", 1, 101.0, 400),
                record(3, "a", 2, 104.0, 560),  # 3 s after turn 1's answer (1 s latency)
                record(4, "a", 3, 110.0, 300),  # shorter than turn 2: the history was cut
                record(5, "b", 2, 112.0, None),  # no token counts: skipped
            ]
        )
        shadow = record(6, "a", 2, 104.0, 560)
        shadow.role = "shadow"
        store.insert([shadow])
        workload = from_store(store, 0.0, 1e12)
    assert workload.skipped == 1
    assert [(r.conversation, r.turn, r.arrival_s) for r in workload.requests] == [
        ("a", 1, 0.0), ("b", 1, 1.0), ("a", 2, 4.0), ("a", 3, 10.0)
    ]  # fmt: skip
    a1, _, a2, a3 = workload.requests
    assert a2.gap_s == pytest.approx(3.0)
    assert a1.gap_s is None
    assert a1.chain == a2.chain != a3.chain
    assert workload.basis_s == pytest.approx(11.0)


def test_pace_spreads_conversations_and_links_their_turns(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    conversation = {
        "messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]
    }
    path.write_text(json.dumps(conversation) + "\n" + json.dumps(conversation) + "\n")
    paced = pace(from_jsonl(path), conversations_per_s=0.5, think_s=3.0)
    firsts = sorted(r.arrival_s for r in paced.requests if r.turn == 1)
    assert firsts == [0.0, 2.0]
    assert {r.gap_s for r in paced.requests if r.turn == 2} == {3.0}
    assert paced.basis_s == 4.0
    faster = scaled(paced, rate=2.0, context=3.0)
    assert sorted(r.arrival_s for r in faster.requests if r.turn == 1) == [0.0, 1.0]
    assert {r.gap_s for r in faster.requests if r.turn == 2} == {1.5}
    assert [r.prompt_tokens for r in faster.requests] == [
        3 * r.prompt_tokens for r in paced.requests
    ]


@pytest.mark.parametrize(
    ("text", "sizes"),
    [("4", [4]), ("1..4", [1, 2, 3, 4]), ("1,2,8", [1, 2, 8]), ("2..8/2", [2, 4, 6, 8])],
)
def test_replica_sizes(text: str, sizes: list[int]) -> None:
    assert parse_sizes(text) == sizes


@pytest.mark.parametrize("text", ["0", "4..2", "a", "1..2/0", ""])
def test_bad_replica_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="replica"):
        parse_sizes(text)
