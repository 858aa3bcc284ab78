"""The report's "Whether users stay" section: one row per arm, then the effects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvmigrate.render import fmt
from kvmigrate.report.users import ArmUsers, Effect, UsersFigures


class Section(NamedTuple):
    """The cells of `tables.Table` (which imports this module), less its key."""

    title: str
    headers: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    note: str
    footnote: str = ""


HEADERS = (
    "arm",
    "conversations",
    "turns / conversation",
    "ended after a slow turn",
    "gave up mid-answer",
    "score",
)
NOTE = "No served conversations in this window."
EFFECT_LABELS = {
    "turns": "turns / conversation",
    "ended_after_slow": "ended after a slow turn",
    "gave_up": "gave up mid-answer",
    "score": "score",
}


def _interval(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return ""
    return f" [{fmt.number(low, 2)}, {fmt.number(high, 2)}]"


def _rate(k: int, n: int, rate: float | None, low: float | None, high: float | None) -> str:
    if rate is None or low is None or high is None:
        return fmt.MISSING
    return f"{k}/{n} {fmt.pct(rate)} [{fmt.pct(low)}, {fmt.pct(high)}]"


def _arm_row(a: ArmUsers) -> tuple[str, ...]:
    turns = fmt.number(a.turns_mean, 2) + _interval(a.turns_low, a.turns_high)
    score = (
        f"{fmt.number(a.score_mean, 2)}{_interval(a.score_low, a.score_high)} (n={a.scores})"
        if a.scores
        else fmt.MISSING
    )
    slow = _rate(
        a.ended_after_slow, a.ended, a.ended_after_slow_rate,
        a.ended_after_slow_low, a.ended_after_slow_high,
    )  # fmt: skip
    gave_up = _rate(a.gave_up, a.streams, a.gave_up_rate, a.gave_up_low, a.gave_up_high)
    if a.cancelled:
        gave_up += f"; {a.cancelled} left before the first byte"
    return (a.backend, f"{a.conversations:,}", turns, slow, gave_up, score)


def _effect_cell(e: Effect) -> str:
    rate = e.metric in ("ended_after_slow", "gave_up")
    if rate:
        text = f"{fmt.pct(e.difference, signed=True)} [{fmt.pct(e.low, signed=True)}, "
        text += f"{fmt.pct(e.high, signed=True)}]"
    else:
        text = f"{e.difference:+.2f} [{e.low:+.2f}, {e.high:+.2f}]"
        if e.cohens_d is not None:
            text += f" d={e.cohens_d:+.2f}"
    return text + ("" if e.excludes_zero else " (spans 0)")


def users_section(users: UsersFigures | None) -> Section:
    title = "Whether users stay, by arm"
    if users is None or not users.arms:
        return Section(title, HEADERS, [], NOTE)
    rows = [_arm_row(a) for a in users.arms]
    if users.effects:
        cells = {e.metric: _effect_cell(e) for e in users.effects}
        label = f"{users.candidate} minus {users.primary}"
        rows.append((label, "", *(cells.get(m, fmt.MISSING) for m in EFFECT_LABELS)))
    confidence = f"{users.confidence:.0%}"
    footnote = (
        f"Intervals at {confidence}; the last row is the difference between the arms, an "
        "interval that spans 0 shows no effect yet (no verdict from a handful). Slow: TTFT "
        f"above {fmt.ms(users.slow_turn_ms)}; a conversation has ended when it has had no "
        f"turn for {fmt.duration(users.idle_s)} before the window's end. Score: "
        f"`{users.score_name}` from POST /v1/feedback"
    )
    if users.unmatched_scores:
        footnote += f"; {users.unmatched_scores} scores named no conversation in the window"
    return Section(title, HEADERS, rows, NOTE, footnote + ".")
