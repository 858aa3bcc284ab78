"""Length agreement: the ratio of answer lengths, and whether one answer stops mid-sentence.

A truncated answer is the classic silent regression (a smaller context window, a lower
default max_tokens). The ratio catches a short answer; the ending catches a cut one even
when the finish reason was misreported, as vLLM has done (`tool_calls` or `stop` hiding a
`length`).
"""

from __future__ import annotations

from kvmigrate.parity.context import PairContext
from kvmigrate.parity.result import ComparatorResult

# Characters a finished answer ends on: sentence ends, closing brackets and quotes, the
# end of a code fence or of a JSON document.
_COMPLETE_ENDINGS = frozenset(".!?)]}\"'`*:;>\u2026\u3002\uff01\uff1f")


def looks_complete(text: str) -> bool:
    stripped = text.rstrip()
    return bool(stripped) and stripped[-1] in _COMPLETE_ENDINGS


def compare_length(ctx: PairContext) -> ComparatorResult | None:
    if not ctx.text_pair:
        return None
    primary, candidate = (t.strip() for t in ctx.texts)
    longer = max(len(primary), len(candidate))
    ratio = min(len(primary), len(candidate)) / longer if longer else 1.0
    cut = looks_complete(primary) and not looks_complete(candidate)
    agree = ratio >= ctx.settings.length_min_ratio and not cut
    detail = f"length {len(candidate)} vs {len(primary)} chars (ratio {ratio:.2f})"
    if cut:
        detail += "; the candidate stops mid-sentence"
    data = {"ratio": ratio, "primary_chars": len(primary), "candidate_chars": len(candidate)}
    return ComparatorResult("length", agree, ratio * (0.5 if cut else 1.0), detail, data)
