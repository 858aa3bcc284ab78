"""Refusal: one side declines to answer and the other does not.

A refusal shows either in the `refusal` field (OpenAI's structured outputs; vLLM leaves it
null) or, far more often, as ordinary text. The patterns look only at the answer's opening,
where refusals put their apology, so an answer that later mentions what it cannot do is not
mistaken for one.
"""

from __future__ import annotations

import re

from kvmigrate.parity.answer import Answer
from kvmigrate.parity.context import PairContext
from kvmigrate.parity.result import ComparatorResult

_OPENING_CHARS = 240
_CANT = r"(?:can ?not|can't|cannot|won't|will not|am unable to|am not able to|must decline to)"
_REFUSALS = tuple(
    re.compile(p)
    for p in (
        rf"^(?:i'm|i am|we're|we are)?\s*sorry,?\s*(?:but\s*)?(?:i|we)\s+{_CANT}",
        rf"^(?:unfortunately|i apologi[sz]e),?\s*(?:but\s*)?(?:i|we)\s+{_CANT}",
        rf"^(?:i|we)\s+{_CANT}\s+(?:help|assist|provide|comply|do that|fulfil|fulfill|"
        r"support|answer|create|generate|share|engage|give|write|complete|process)",
        r"^(?:i'm|i am) (?:unable|not able) to (?:help|assist|provide|comply|answer)",
        r"^as an ai(?: language model| assistant)?,? i (?:can ?not|can't|am unable|don't)",
        r"^(?:i|we) must (?:decline|refuse)",
        r"^(?:sorry|i'm sorry|i am sorry),? (?:i|we) (?:can't|cannot|won't) (?:do|help)",
    )
)


def refusal_of(answer: Answer) -> str | None:
    """The refusal text, or None when the answer does not refuse."""
    if answer.refusal:
        return answer.refusal
    if answer.finish_reason == "content_filter":
        return "(finish_reason content_filter)"
    opening = answer.text.strip()[:_OPENING_CHARS].replace("\u2019", "'").casefold()
    opening = " ".join(opening.split())
    if any(p.search(opening) for p in _REFUSALS):
        return answer.text.strip()[:_OPENING_CHARS]
    return None


def compare_refusal(ctx: PairContext) -> ComparatorResult:
    primary = refusal_of(ctx.primary_answer)
    candidate = refusal_of(ctx.candidate_answer)
    agree = (primary is None) == (candidate is None)
    if agree:
        detail = "both refuse" if primary else "neither refuses"
    elif candidate:
        detail = f"the candidate refuses: {candidate[:80]!r}"
    else:
        detail = f"the primary refuses, the candidate answers: {(primary or '')[:80]!r}"
    data = {"primary_refuses": primary is not None, "candidate_refuses": candidate is not None}
    return ComparatorResult("refusal", agree, 1.0 if agree else 0.0, detail, data)
