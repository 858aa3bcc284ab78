"""Parity request by request: which requests diverged, side by side, and what changed since
the last run.

The aggregate says how much; these say which. A request's divergence counts only on the
comparators where its primary agreed with itself: where the primary's own repeat disagreed
too, the candidate's difference is within that request's noise.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from kvmigrate.parity.offline import answer_text
from kvmigrate.parity.replay import ItemResult
from kvmigrate.parity.result import CANDIDATE_ERROR, PRIMARY_ERROR
from kvmigrate.redaction import redact_text

# A request's verdict: how the candidate's answer relates to the primary's.
AGREE, NOISE, DIVERGED = "agree", "within_noise", "diverged"
SKIPPED = "skipped"


def request_verdicts(results: Sequence[ItemResult]) -> Iterator[dict[str, Any]]:
    """One line per request: its verdict, the comparators beyond its noise, and the scores."""
    for result in results:
        yield _line(result, with_answers=False)


def detail_lines(results: Sequence[ItemResult]) -> Iterator[dict[str, Any]]:
    """`request_verdicts` with both answers, redacted, for a person to read side by side."""
    for result in results:
        yield _line(result, with_answers=True)


def details_jsonl(results: Sequence[ItemResult]) -> str:
    """`detail_lines` as JSONL text, for the caller to write whole."""
    return "".join(orjson.dumps(line).decode() + "\n" for line in detail_lines(results))


def _line(result: ItemResult, with_answers: bool) -> dict[str, Any]:
    score = result.candidate_score
    line: dict[str, Any] = {"id": result.item.id, "route": result.item.route}
    if result.skipped or score is None:
        line.update(verdict=SKIPPED, reason=result.skipped or "not scored")
        return line
    noisy = frozenset().union(*(s.disagreements for s in result.noise_scores))
    beyond = sorted(score.disagreements - noisy)
    if score.outcome == CANDIDATE_ERROR or beyond:
        verdict = DIVERGED
    elif score.outcome == PRIMARY_ERROR:
        verdict = SKIPPED
    else:
        verdict = NOISE if score.disagreements else AGREE
    line.update(
        verdict=verdict,
        outcome=score.outcome,
        score=None if score.score is None else round(score.score, 4),
        diverged_on=beyond,
        within_noise=sorted(score.disagreements & noisy),
        comparators={
            r.name: {"agree": r.agree, "score": round(r.score, 4), "detail": r.detail}
            for r in score.results
        },
    )
    if with_answers:
        route = result.item.route
        line["primary"] = redact_text(answer_text(route, result.primary))
        line["candidate"] = redact_text(answer_text(route, result.candidate))
    return line


@dataclass(frozen=True, slots=True)
class Changes:
    """What moved since a baseline run: by request id."""

    new_divergences: tuple[str, ...]
    fixed: tuple[str, ...]
    still_diverged: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "new_divergences": list(self.new_divergences),
            "fixed": list(self.fixed),
            "still_diverged": list(self.still_diverged),
        }


def compare_runs(
    baseline: Iterable[Mapping[str, Any]], current: Iterable[Mapping[str, Any]]
) -> Changes:
    """Requests that diverge now and did not before (new or newly broken), that diverged
    before and agree now, and that diverge in both. A request only one run has is new when
    it diverges, and says nothing when it does not."""
    before = {str(line["id"]): line.get("verdict") for line in baseline}
    now = {str(line["id"]): line.get("verdict") for line in current}
    new = [i for i, v in now.items() if v == DIVERGED and before.get(i) != DIVERGED]
    fixed = [i for i, v in before.items() if v == DIVERGED and now.get(i) in (AGREE, NOISE)]
    still = [i for i, v in now.items() if v == DIVERGED and before.get(i) == DIVERGED]
    return Changes(tuple(new), tuple(fixed), tuple(still))


class BaselineError(ValueError):
    """A baseline file that is not a `kvmigrate parity --json` report or `--details` file."""


def read_baseline(path: str) -> list[Mapping[str, Any]]:
    """The per-request verdicts of an earlier run: its `--json` report (`per_request`) or
    its `--details` JSONL."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise BaselineError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        lines = data.get("per_request")
        if not isinstance(lines, list):
            raise BaselineError(f"{path}: a parity --json report without `per_request`")
        return [line for line in lines if isinstance(line, dict) and "id" in line]
    try:
        parsed = [orjson.loads(row) for row in raw.splitlines() if row.strip()]
    except orjson.JSONDecodeError as exc:
        raise BaselineError(f"{path}: neither a parity --json report nor JSONL: {exc}") from None
    return [line for line in parsed if isinstance(line, dict) and "id" in line]
