"""`report.users.users_figures`, a pure function of rows and scores: tables of what each
figure counts, and the effect between the arms with its interval."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pytest

from kvmigrate.report.means import mean_interval, t_quantile, welch_difference
from kvmigrate.report.rows import Row
from kvmigrate.report.users import Score, UsersFigures, users_figures

UNTIL = 10_000.0


def row(conversation: str, turn: int, backend: str = "hosted", **kw: object) -> Row:
    base: dict[str, object] = {
        "request_id": f"{conversation}-{turn}-{kw.get('role', 'serve')}", "ts": 100.0 + turn,
        "backend": backend, "role": "serve", "conversation": conversation, "turn": turn,
        "status": 200, "error": None, "ttft_ms": 100.0, "latency_ms": 200.0,
        "prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 1, "pair_id": None,
        "parity_score": None, "parity_tool_agree": None, "parity_json_valid": None,
        "parity_kind": None, "parity_applicable": None, "parity_disagree": None,
    }  # fmt: skip
    base.update(kw)
    return Row(**base)  # type: ignore[arg-type]


def conversation(key: str, turns: int, backend: str, **last: object) -> list[Row]:
    return [row(key, t, backend, **(last if t == turns else {})) for t in range(1, turns + 1)]


def figures(
    rows: Sequence[Row],
    scores: Sequence[Score] = (),
    answers: Mapping[str, str] | None = None,
    *,
    slow_turn_ms: float = 2000.0,
    idle_s: float = 300.0,
) -> UsersFigures:
    return users_figures(
        rows, scores, answers or {}, primary="hosted", candidate="vllm", until=UNTIL,
        slow_turn_ms=slow_turn_ms, idle_s=idle_s,
    )  # fmt: skip


def test_each_conversation_counts_for_the_arm_that_served_its_first_turn() -> None:
    rows = conversation("a", 3, "hosted") + conversation("b", 2, "vllm")
    # A copy of b's turn to the primary (shadow) is no turn of the primary's arm.
    rows.append(row("b", 1, "hosted", role="shadow"))
    result = figures(sorted(rows, key=lambda r: r.ts))
    hosted, vllm = result.arm("hosted"), result.arm("vllm")
    assert hosted is not None
    assert vllm is not None
    assert (hosted.conversations, hosted.turns_mean) == (1, 3.0)
    assert (vllm.conversations, vllm.turns_mean) == (1, 2.0)
    assert [a.backend for a in result.arms] == ["hosted", "vllm"]


@pytest.mark.parametrize(
    ("last_ttft", "last_ts", "ended", "after_slow"),
    [
        (2500.0, 500.0, 1, 1),  # slow last turn, long ago: ended after a slow turn
        (1500.0, 500.0, 1, 0),  # fast last turn: ended, not after a slow one
        (2000.0, 500.0, 1, 0),  # exactly the threshold is not slow
        (2500.0, UNTIL - 10, 0, 0),  # still within the idle time: not ended yet
        (None, 500.0, 1, 0),  # no first token (an error): not a slow turn
    ],
)
def test_ended_after_a_slow_turn(
    last_ttft: float | None, last_ts: float, ended: int, after_slow: int
) -> None:
    rows = [row("a", 1), row("a", 2, ttft_ms=last_ttft, ts=last_ts)]
    arm = figures(rows, slow_turn_ms=2000.0, idle_s=300.0).arm("hosted")
    assert arm is not None
    assert (arm.ended, arm.ended_after_slow) == (ended, after_slow)


@pytest.mark.parametrize(
    ("error", "ttft", "streams", "gave_up", "cancelled"),
    [
        ("client_disconnected", 90.0, 1, 1, 0),  # left mid-answer
        ("client_disconnected", None, 1, 1, 0),
        ("client_cancelled", None, 0, 0, 1),  # left before the first byte
        (None, 90.0, 1, 0, 0),
        ("http_500", None, 0, 0, 0),
    ],
)
def test_clients_that_give_up(
    error: str | None, ttft: float | None, streams: int, gave_up: int, cancelled: int
) -> None:
    arm = figures([row("a", 1, error=error, ttft_ms=ttft)]).arm("hosted")
    assert arm is not None
    assert (arm.streams, arm.gave_up, arm.cancelled) == (streams, gave_up, cancelled)


def test_scores_join_by_conversation_or_answer_and_the_rest_are_counted() -> None:
    rows = conversation("a", 2, "hosted") + conversation("b", 2, "vllm")
    scores = [
        Score("a", None, "satisfaction", 5.0),
        Score(None, "k:answer-b", "satisfaction", 2.0),
        Score(None, "k:unknown", "satisfaction", 1.0),
        Score("nobody", None, "satisfaction", 1.0),
        Score("a", None, "thumbs", 1.0),
    ]
    result = figures(rows, scores, {"k:answer-b": "b"})
    hosted, vllm = result.arm("hosted"), result.arm("vllm")
    assert hosted is not None
    assert vllm is not None
    assert (hosted.scores, hosted.score_mean) == (1, 5.0)
    assert (vllm.scores, vllm.score_mean) == (1, 2.0)
    assert (result.unmatched_scores, result.other_scores) == (2, 1)


def test_effects_are_candidate_minus_primary_with_intervals() -> None:
    rows: list[Row] = []
    for i in range(30):
        rows += conversation(f"h{i}", 5 + i % 3, "hosted")
        rows += conversation(f"v{i}", 2 + i % 3, "vllm")
    result = figures(rows)
    turns = result.effect("turns")
    assert turns is not None
    assert turns.difference == pytest.approx(-3.0)
    assert turns.high < 0
    assert turns.excludes_zero
    assert turns.cohens_d is not None
    assert turns.cohens_d < -2
    assert (turns.n_candidate, turns.n_primary) == (30, 30)
    # Alike arms: the interval spans zero.
    alike = figures([r._replace(backend="vllm") if r.conversation.startswith("v") else r
                     for r in rows if not r.conversation.startswith("v")]
                    + [r._replace(backend="vllm", conversation="w" + r.conversation)
                       for r in rows if r.conversation.startswith("h")])  # fmt: skip
    same = alike.effect("turns")
    assert same is not None
    assert same.difference == 0.0
    assert not same.excludes_zero


def test_too_few_values_give_no_effect() -> None:
    result = figures(conversation("a", 2, "hosted") + conversation("b", 3, "vllm"))
    assert result.effect("turns") is None  # one conversation an arm: no interval


def test_welch_matches_known_figures() -> None:
    z = 1.959963984540054
    # t(0.975, 10) = 2.228; the expansion is within 0.005.
    assert t_quantile(z, 10) == pytest.approx(2.228, abs=0.005)
    assert t_quantile(z, math.inf) == z
    iv = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0], z)
    assert (iv.low + iv.high) / 2 == pytest.approx(3.0)
    assert iv.high - 3.0 == pytest.approx(2.776 * math.sqrt(2.5 / 5), abs=0.02)
    diff = welch_difference([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], z)
    assert diff is not None
    assert diff.difference == 0.0
    assert diff.interval.low < 0 < diff.interval.high
    assert welch_difference([1.0], [2.0, 3.0], z) is None


def test_scorecard_fields_read_one_effect() -> None:
    rows: list[Row] = []
    for i in range(10):
        rows += conversation(f"h{i}", 4, "hosted") + conversation(f"v{i}", 2 + i % 2, "vllm")
    scores = [Score(f"h{i}", None, "satisfaction", 4.0 + i % 2) for i in range(10)]
    result = figures(rows, scores)
    turns = result.scorecard_fields("turns")
    effect = result.effect("turns")
    assert effect is not None
    assert turns == {
        "measure": "turns per conversation", "primary": 4.0, "candidate": 2.5,
        "difference": effect.difference, "low": effect.low, "high": effect.high,
        "primary_n": 10, "candidate_n": 10, "higher_is_better": True,
        "source": "kvmigrate report: whether users stay", "missing": "",
    }  # fmt: skip
    # Scores on one arm only: no effect, and the row says why.
    score = result.scorecard_fields("score")
    assert (score["primary"], score["candidate"], score["difference"]) == (4.5, None, None)
    assert score["missing"] == (
        "no satisfaction score on both arms with two or more samples each (primary 10, candidate 0)"
    )
