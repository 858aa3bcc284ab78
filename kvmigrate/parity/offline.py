"""The result of an offline replay: the noise-adjusted report, error counts, and the worst
examples per comparator, with redacted excerpts for a person to read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmigrate.parity.answer import extract_answer, last_user_text, read_outcome
from kvmigrate.parity.noise import NoiseSettings, ParityReport, calibrate, tally
from kvmigrate.parity.replay import Call, ItemResult
from kvmigrate.redaction import redact_text

EXCERPT_CHARS = 160
WORST_PER_COMPARATOR = 3


@dataclass(frozen=True, slots=True)
class Example:
    """One divergent pair: which request, what disagreed, and short redacted excerpts."""

    id: str
    comparator: str
    score: float
    detail: str
    request: str
    primary: str
    candidate: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "comparator": self.comparator,
            "score": round(self.score, 4),
            "detail": self.detail,
            "request": self.request,
            "primary": self.primary,
            "candidate": self.candidate,
        }


@dataclass(frozen=True, slots=True)
class OfflineReport:
    parity: ParityReport
    requests: int
    skipped: int
    errors: dict[str, Counter[str]]  # backend role -> error kind -> count
    worst: dict[str, tuple[Example, ...]] = field(default_factory=dict)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    # backend role -> calls it answered usably (a JSON answer, no error): two backends that
    # both fail every call agree perfectly, which is no evidence of parity.
    answered: dict[str, int] = field(default_factory=dict)

    def unanswered_roles(self) -> list[str]:
        """The roles that answered none of the requests scored."""
        if self.requests - self.skipped <= 0:
            return []
        return [role for role in ("primary", "candidate") if self.answered.get(role, 0) == 0]

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.parity.to_dict(),
            "requests": self.requests,
            "skipped": self.skipped,
            "skip_reasons": dict(self.skip_reasons),
            "errors": {role: dict(kinds) for role, kinds in self.errors.items()},
            "answered": dict(self.answered),
            "worst": {
                name: [e.to_dict() for e in examples] for name, examples in self.worst.items()
            },
        }


def excerpt(text: str) -> str:
    flat = " ".join(redact_text(text).split())
    return flat if len(flat) <= EXCERPT_CHARS else flat[: EXCERPT_CHARS - 1] + "…"


def _answer_excerpt(route: str, call: Call | None) -> str:
    return excerpt(answer_text(route, call))


def answer_text(route: str, call: Call | None) -> str:
    """What a backend answered, for a person: the text, the refusal, the tool calls, or the
    error. Redaction is the caller's (an excerpt or a details line)."""
    if call is None:
        return ""
    if call.status is None:
        return f"<{call.error}>"
    outcome = read_outcome(route, call.body, call.status)
    if not outcome.ok:
        return f"<HTTP {call.status}> " + call.body.decode("utf-8", "replace")
    answer = extract_answer(outcome.response or {})
    if answer.tool_calls:
        return ", ".join(f"{c.name}({c.arguments})" for c in answer.tool_calls)
    return answer.refusal or answer.text


def worst_examples(results: Sequence[ItemResult], limit: int) -> dict[str, tuple[Example, ...]]:
    found: dict[str, list[Example]] = {}
    for result in results:
        score = result.candidate_score
        if score is None:
            continue
        for comparator in score.results:
            if comparator.agree:
                continue
            found.setdefault(comparator.name, []).append(
                Example(
                    result.item.id,
                    comparator.name,
                    comparator.score,
                    comparator.detail,
                    excerpt(last_user_text(result.item.body)),
                    _answer_excerpt(result.item.route, result.primary),
                    _answer_excerpt(result.item.route, result.candidate),
                )
            )
    return {
        name: tuple(sorted(examples, key=lambda e: e.score)[:limit])
        for name, examples in found.items()
    }


def summarise(
    results: Sequence[ItemResult], settings: NoiseSettings | None = None
) -> OfflineReport:
    errors: dict[str, Counter[str]] = {"primary": Counter(), "candidate": Counter()}
    answered = {"primary": 0, "candidate": 0}
    skips: Counter[str] = Counter()
    for result in results:
        if result.skipped:
            skips[result.skipped] += 1
            continue
        for role, calls in (
            ("primary", (result.primary, *result.repeats)),
            ("candidate", (result.candidate,)),
        ):
            for call in calls:
                if call is not None and call.error:
                    errors[role][call.error] += 1
                elif (
                    call is not None and read_outcome(result.item.route, call.body, call.status).ok
                ):
                    answered[role] += 1
    candidate = tally(r.candidate_score for r in results if r.candidate_score is not None)
    noise = tally(s for r in results for s in r.noise_scores)
    return OfflineReport(
        parity=calibrate(candidate, noise, settings),
        requests=len(results),
        skipped=sum(skips.values()),
        errors=errors,
        worst=worst_examples(results, WORST_PER_COMPARATOR),
        skip_reasons=skips,
        answered=answered,
    )
