"""Text agreement: exact after normalisation, else a fuzzy similarity; and topic agreement.

Two samples of one model rarely match word for word, so exact equality alone would flag
almost every pair. The fuzzy score (rapidfuzz's Indel ratio) tolerates rewording; the
topic check catches what a fuzzy score can miss on short answers: an answer about
something else, which shares the filler words of any answer but none of the request's
subject terms.
"""

from __future__ import annotations

import json
import re
import unicodedata

from rapidfuzz import fuzz

from kvmigrate.parity.answer import last_user_text
from kvmigrate.parity.context import PairContext
from kvmigrate.parity.result import ComparatorResult

_WORD = re.compile(r"[^\W\d_]{3,}")
_STOPWORD_TEXT = """
    the and for are but not you all any can had her was one our out has his how its may new now
    old see two way who did get let put say she too use what with this that from have they will
    would there their been were which when your about into more some than them then these could
    other like just also only tell please give explain write make does should where why each
    summarise summarize describe discuss list show compare provide help using want need know
    think find here sure short answer question brief briefly overview following below above
    very much many most such well yes via per given based include includes including while
    """
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def normalise(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed: differences no reader would notice."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(folded.split())


def canonical_json(text: str) -> str | None:
    """Key-sorted compact JSON when the text is a JSON document, so that key order and
    spacing do not count as differences."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        return json.dumps(json.loads(stripped), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return None


def similarity(a: str, b: str, limit: int) -> float:
    return float(fuzz.ratio(a[:limit], b[:limit])) / 100.0


def compare_text(ctx: PairContext) -> ComparatorResult | None:
    if not ctx.text_pair:
        return None
    primary, candidate = ctx.texts
    a = canonical_json(primary) or normalise(primary)
    b = canonical_json(candidate) or normalise(candidate)
    if a == b:
        return ComparatorResult("text", True, 1.0, "identical after normalisation", {"exact": True})
    score = similarity(a, b, ctx.settings.max_text_chars)
    threshold = ctx.settings.text_min_similarity
    agree = score >= threshold
    detail = f"fuzzy similarity {score:.2f} {'>=' if agree else '<'} {threshold:g}"
    return ComparatorResult("text", agree, score, detail, {"exact": False, "similarity": score})


def key_terms(text: str) -> set[str]:
    """Content words, crudely singularised so that 'databases' matches 'database'."""
    terms = set()
    for word in _WORD.findall(text.casefold()):
        if word in _STOPWORDS:
            continue
        if len(word) > 4 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        terms.add(word)
    return terms


def compare_topic(ctx: PairContext) -> ComparatorResult | None:
    """Whether the candidate's answer is about what was asked: how many of the request's
    key terms it uses, against how many the primary's answer uses. An answer on another
    topic uses none. Not applicable when the primary uses none (nothing to hold the
    candidate to) or either side gave no text."""
    if not ctx.text_pair:
        return None
    primary, candidate = ctx.texts
    if not primary.strip() or not candidate.strip():
        return None
    asked = key_terms(last_user_text(ctx.request))
    by_primary = asked & key_terms(primary)
    if not by_primary:
        return None
    by_candidate = asked & key_terms(candidate)
    # Relative to the primary, not to the request: answers rarely echo every term, and
    # two samples may pick different ones (one says "glaciers", the other "history").
    coverage = min(1.0, len(by_candidate) / len(by_primary))
    agree = bool(by_candidate) and coverage >= ctx.settings.topic_min_coverage
    detail = f"uses {len(by_candidate)} of the request's terms, the primary {len(by_primary)}"
    if not by_candidate:
        detail += f"; none of: {', '.join(sorted(by_primary)[:6])}"
    data = {
        "coverage": coverage,
        "primary_terms": sorted(by_primary)[:20],
        "candidate_terms": sorted(by_candidate)[:20],
    }
    return ComparatorResult("topic", agree, coverage, detail, data)
