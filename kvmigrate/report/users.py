"""Whether users stay, by arm: the business side of a split, with intervals and effect sizes.

Each conversation belongs to the arm (backend) that served its first recorded turn: a split
is sticky, so that is the arm it saw. Per arm:

- turns per conversation: the distinct turns served in the window;
- ended after a slow turn: of the conversations that ended (no turn in the last `idle_s` of
  the window), the share whose last turn was slow (TTFT above `slow_turn_ms`: the gates'
  `ttft_p95_slo_ms`, else the playbook's 2 s);
- gave up mid-answer: of streamed answers, the share the client left after the answer began
  (`client_disconnected`: the proxy records it); those who left before the first byte
  (`client_cancelled`) are counted beside it;
- satisfaction: the scores `POST /v1/feedback` stored under `score_name`, each joined to its
  conversation by the conversation id or by the id of the answer it names.

Effects are the candidate's arm minus the primary's, each with its interval (Welch for
means, Newcombe for rates) and, for means, Cohen's d. An interval that spans zero shows no
effect yet; the figures never pass a verdict.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvmigrate.exchange import Role
from kvmigrate.intervals import newcombe_difference, wilson, z_for
from kvmigrate.policies.outcome import ErrorKind
from kvmigrate.recorder.store import RecordStore
from kvmigrate.report.means import mean_interval, welch_difference
from kvmigrate.report.rows import Row

SLOW_TURN_MS = 2000.0  # the playbook's TTFT target, when no SLO is configured
IDLE_S = 300.0
SCORE_NAME = "satisfaction"
# Each effect for the scorecard: its words, whether higher is better, and the ArmUsers
# fields of its figure and of the samples behind it.
SCORECARD_MEASURES: dict[str, tuple[str, bool, str, str]] = {
    "score": ("satisfaction score", True, "score_mean", "scores"),
    "turns": ("turns per conversation", True, "turns_mean", "conversations"),
    "ended_after_slow": ("share ending after a slow turn", False, "ended_after_slow_rate", "ended"),
    "gave_up": ("share of streams given up mid-answer", False, "gave_up_rate", "streams"),
}


class Score(NamedTuple):
    conversation: str | None  # as records keep it (keyed hash)
    response_id: str | None
    name: str
    value: float


@dataclass(frozen=True, slots=True)
class ArmUsers:
    """One arm's figures; each interval at the report's confidence (None: no data)."""

    backend: str
    conversations: int
    turns_mean: float | None = None
    turns_low: float | None = None
    turns_high: float | None = None
    ended: int = 0
    ended_after_slow: int = 0
    ended_after_slow_rate: float | None = None
    ended_after_slow_low: float | None = None
    ended_after_slow_high: float | None = None
    streams: int = 0
    gave_up: int = 0
    gave_up_rate: float | None = None
    gave_up_low: float | None = None
    gave_up_high: float | None = None
    cancelled: int = 0  # left before the first byte
    scores: int = 0
    score_mean: float | None = None
    score_low: float | None = None
    score_high: float | None = None


@dataclass(frozen=True, slots=True)
class Effect:
    """The candidate's arm minus the primary's on one figure. `cohens_d` for means only."""

    metric: str  # turns, ended_after_slow, gave_up, score
    difference: float
    low: float
    high: float
    n_candidate: int
    n_primary: int
    cohens_d: float | None = None

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


@dataclass(frozen=True, slots=True)
class UsersFigures:
    primary: str
    candidate: str
    confidence: float
    slow_turn_ms: float
    idle_s: float
    score_name: str
    arms: tuple[ArmUsers, ...] = ()
    effects: tuple[Effect, ...] = ()
    unmatched_scores: int = 0  # scores naming no conversation or answer in the window
    other_scores: int = 0  # scores under other names

    def arm(self, backend: str) -> ArmUsers | None:
        return next((a for a in self.arms if a.backend == backend), None)

    def effect(self, metric: str) -> Effect | None:
        return next((e for e in self.effects if e.metric == metric), None)

    def scorecard_fields(self, metric: str = "score") -> dict[str, Any]:
        """One effect as the scorecard's users row reads it (measure, each arm's figure,
        the difference with its interval, the samples behind each arm, which way is
        better, and why it is missing when it is)."""
        measure, better, field_of, n_of = SCORECARD_MEASURES[metric]
        arms = [self.arm(self.primary), self.arm(self.candidate)]
        figures = [None if a is None else getattr(a, field_of) for a in arms]
        counts = [0 if a is None else int(getattr(a, n_of)) for a in arms]
        effect = self.effect(metric)
        missing = "" if effect is not None else (
            f"no {measure} on both arms with two or more samples each "
            f"(primary {counts[0]}, candidate {counts[1]})"
        )  # fmt: skip
        return {
            "measure": measure,
            "primary": figures[0],
            "candidate": figures[1],
            "difference": None if effect is None else effect.difference,
            "low": None if effect is None else effect.low,
            "high": None if effect is None else effect.high,
            "primary_n": counts[0],
            "candidate_n": counts[1],
            "higher_is_better": better,
            "source": "kvmigrate report: whether users stay",
            "missing": missing,
        }


def fetch_scores(
    store: RecordStore, since: float, until: float
) -> tuple[list[Score], dict[str, str]]:
    """The scores given in [since, until) and, for the answers of the window, response id to
    conversation. Empty for a database from before feedback (no such table or column)."""
    if "value" not in store.columns("feedback"):
        return [], {}
    scores = [
        Score(*row)
        for row in store.query(
            "SELECT conversation, response_id, name, value FROM feedback "
            "WHERE ts >= ? AND ts < ? ORDER BY ts",
            (since, until),
        )
    ]
    answers = store.query(
        "SELECT response_id, conversation FROM records "
        "WHERE ts >= ? AND ts < ? AND response_id IS NOT NULL",
        (since, until),
    )
    return scores, {str(r): str(c) for r, c in answers}


@dataclass(slots=True)
class _Conversation:
    backend: str
    turns: set[int] = field(default_factory=set)
    last_ts: float = 0.0
    last_ttft: float | None = None


def _conversations(rows: Sequence[Row]) -> dict[str, _Conversation]:
    seen: dict[str, _Conversation] = {}
    for row in rows:  # in time order
        if row.role != Role.SERVE:
            continue
        c = seen.setdefault(row.conversation, _Conversation(row.backend))
        c.turns.add(row.turn)
        if row.ts >= c.last_ts:
            c.last_ts, c.last_ttft = row.ts, row.ttft_ms
    return seen


def users_figures(
    rows: Sequence[Row],
    scores: Sequence[Score],
    answers: Mapping[str, str],
    *,
    primary: str,
    candidate: str,
    until: float,
    slow_turn_ms: float = SLOW_TURN_MS,
    idle_s: float = IDLE_S,
    score_name: str = SCORE_NAME,
    confidence: float = 0.95,
) -> UsersFigures:
    z = z_for(confidence)
    conversations = _conversations(rows)
    arm_of = {key: c.backend for key, c in conversations.items()}
    by_arm: dict[str, _ArmData] = defaultdict(_ArmData)
    for c in conversations.values():
        data = by_arm[c.backend]
        data.turns.append(float(len(c.turns)))
        if c.last_ts < until - idle_s:
            data.ended += 1
            data.after_slow += c.last_ttft is not None and c.last_ttft > slow_turn_ms
    for row in rows:
        if row.role == Role.SERVE:
            by_arm[row.backend].add_call(row)
    unmatched = other = 0
    for score in scores:
        if score.name != score_name:
            other += 1
            continue
        key = score.conversation or answers.get(score.response_id or "")
        if key is None or key not in arm_of:
            unmatched += 1
            continue
        by_arm[arm_of[key]].scores.append(score.value)
    order = sorted(by_arm, key=lambda b: (b != primary, b != candidate, b))
    arms = tuple(by_arm[b].figures(b, z) for b in order)
    effects = _effects(by_arm.get(candidate), by_arm.get(primary), z)
    return UsersFigures(
        primary, candidate, confidence, slow_turn_ms, idle_s, score_name,
        arms, effects, unmatched, other,
    )  # fmt: skip


@dataclass(slots=True)
class _ArmData:
    turns: list[float] = field(default_factory=list)
    ended: int = 0
    after_slow: int = 0
    streams: int = 0
    gave_up: int = 0
    cancelled: int = 0
    scores: list[float] = field(default_factory=list)

    def add_call(self, row: Row) -> None:
        if row.error == ErrorKind.CLIENT_CANCELLED:
            self.cancelled += 1
        # A streamed answer has a first token; one the client left mid-way is marked.
        if row.ttft_ms is not None or row.error == ErrorKind.CLIENT_DISCONNECTED:
            self.streams += 1
            self.gave_up += row.error == ErrorKind.CLIENT_DISCONNECTED

    def figures(self, backend: str, z: float) -> ArmUsers:
        turns = _mean(self.turns, z)
        scores = _mean(self.scores, z)
        slow = _rate(self.after_slow, self.ended, z)
        gave_up = _rate(self.gave_up, self.streams, z)
        return ArmUsers(
            backend, len(self.turns), *turns, self.ended, self.after_slow, *slow,
            self.streams, self.gave_up, *gave_up, self.cancelled, len(self.scores), *scores,
        )  # fmt: skip


Triple = tuple[float | None, float | None, float | None]


def _mean(values: Sequence[float], z: float) -> Triple:
    if not values:
        return None, None, None
    iv = mean_interval(values, z)
    return sum(values) / len(values), iv.low, iv.high


def _rate(k: int, n: int, z: float) -> Triple:
    if n == 0:
        return None, None, None
    iv = wilson(k, n, z)
    return k / n, iv.low, iv.high


def _effects(cand: _ArmData | None, prim: _ArmData | None, z: float) -> tuple[Effect, ...]:
    if cand is None or prim is None:
        return ()
    effects: list[Effect] = []
    for metric, a, b in (("turns", cand.turns, prim.turns), ("score", cand.scores, prim.scores)):
        diff = welch_difference(a, b, z)
        if diff is not None:
            iv = diff.interval
            effects.append(
                Effect(metric, diff.difference, iv.low, iv.high, len(a), len(b), diff.cohens_d)
            )
    for metric, (k1, n1), (k2, n2) in (
        ("ended_after_slow", (cand.after_slow, cand.ended), (prim.after_slow, prim.ended)),
        ("gave_up", (cand.gave_up, cand.streams), (prim.gave_up, prim.streams)),
    ):
        if n1 and n2:
            difference, iv = newcombe_difference(k1, n1, k2, n2, z)
            effects.append(Effect(metric, difference, iv.low, iv.high, n1, n2))
    return tuple(effects)
