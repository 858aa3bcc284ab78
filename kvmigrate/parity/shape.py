"""API shape: fields the candidate's response lacks or adds against the primary's, and the
status class and envelope of errors.

Clients break on shape long before they notice wording. A field counts as present when it
holds a value: null, [] and {} count as absent, because vLLM sends null where OpenAI omits a
field and the reverse, and clients treat both alike. The fields vLLM is known to add or to
leave out (`ParitySettings.allowed_extra` / `allowed_missing`) are allowed. Content fields
(text, refusal, reasoning, tool calls) are left to the content comparators; tool-call
structure counts when both sides called tools.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from kvmigrate.parity.answer import Outcome
from kvmigrate.parity.context import PairContext
from kvmigrate.parity.result import ComparatorResult

_CONTENT = frozenset(
    {
        "choices[].message.content",
        "choices[].message.refusal",
        "choices[].message.reasoning_content",
        "choices[].message.reasoning",
        "choices[].message.function_call",
        "choices[].text",
        "output",
        "content",  # an Anthropic Message's content blocks (text, tool_use, thinking)
    }
)
_TOOL_CALLS = "choices[].message.tool_calls"


def shape_paths(value: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every field that holds a value; `[]` stands for any list element."""
    paths: set[str] = set()
    if isinstance(value, dict):  # decoded JSON: a dict check is far cheaper than Mapping's
        for key, child in value.items():
            if child is None or child == [] or child == {}:
                continue
            path = f"{prefix}.{key}" if prefix else str(key)
            if path in _CONTENT:
                continue
            paths.add(path)
            paths |= shape_paths(child, path)
    elif isinstance(value, list):
        for item in value:
            paths |= shape_paths(item, prefix + "[]")
    return paths


@functools.lru_cache(maxsize=4096)
def covered(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether a pattern covers the path or a field above it (`a.b.*` and `a.b` alike).
    Cached: every answer of a stream of pairs has the same few dozen paths."""
    for pattern in patterns:
        base = pattern.removesuffix(".*")
        if path == base or path.startswith((base + ".", base + "[]")):
            return True
    return False


def envelope_kind(error: Mapping[str, Any] | None) -> str:
    """OpenAI's nested `{"error": {...}}`, vLLM's pre-0.10.1 flat one, and other forms."""
    if error is None:
        return "none"
    inner = error.get("error")
    if isinstance(inner, Mapping):
        return "nested" if "message" in inner else "nested_without_message"
    if isinstance(inner, str):
        return "string"
    if error.get("object") == "error":
        return "flat"
    return "detail" if "detail" in error else "other"


def _error_code_type(error: Mapping[str, Any] | None) -> str:
    inner = error.get("error") if error is not None else None
    holder = inner if isinstance(inner, Mapping) else (error or {})
    return type(holder.get("code")).__name__


def compare_errors(primary: Outcome, candidate: Outcome) -> ComparatorResult:
    """Both sides or one side failed: the status class, then the envelope must match."""
    p_class, c_class = primary.status_class, candidate.status_class
    data: dict[str, Any] = {"primary_status": primary.status, "candidate_status": candidate.status}
    if p_class != c_class:
        detail = f"status {candidate.status or c_class} vs {primary.status or p_class}"
        return ComparatorResult("api_shape", False, 0.0, detail, data)
    p_kind, c_kind = envelope_kind(primary.error), envelope_kind(candidate.error)
    data.update(primary_envelope=p_kind, candidate_envelope=c_kind)
    if p_kind != c_kind:
        detail = f"error envelope {c_kind} vs {p_kind}"
        return ComparatorResult("api_shape", False, 0.5, detail, data)
    detail = f"same status class {p_class} and {p_kind} envelope"
    p_code, c_code = _error_code_type(primary.error), _error_code_type(candidate.error)
    if p_code != c_code:
        # vLLM's numeric `code` against OpenAI's strings: known, and allowed.
        detail += f" (error code {c_code} vs {p_code})"
    return ComparatorResult("api_shape", True, 1.0, detail, data)


def compare_shape(ctx: PairContext) -> ComparatorResult | None:
    primary, candidate = ctx.primary, ctx.candidate
    if not (primary.ok and candidate.ok):
        return compare_errors(primary, candidate)
    if primary.streamed != candidate.streamed or primary.response is None:
        return None  # a stream reassembles into fewer fields than a JSON body has
    p_paths = shape_paths(primary.response)
    c_paths = shape_paths(candidate.response or {})
    if not (ctx.primary_answer.is_tool_answer and ctx.candidate_answer.is_tool_answer):
        p_paths = {p for p in p_paths if not covered(p, (_TOOL_CALLS,))}
        c_paths = {p for p in c_paths if not covered(p, (_TOOL_CALLS,))}
    settings = ctx.settings
    missing = sorted(p for p in p_paths - c_paths if not covered(p, settings.allowed_missing))
    extra = sorted(p for p in c_paths - p_paths if not covered(p, settings.allowed_extra))
    union = len(p_paths | c_paths) or 1
    score = max(0.0, 1.0 - (len(missing) + len(extra)) / union)
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:6])}")
    if extra:
        problems.append(f"extra {', '.join(extra[:6])}")
    detail = "; ".join(problems) or "same fields (allowing vLLM's known differences)"
    data = {"missing": missing, "extra": extra}
    return ComparatorResult("api_shape", not problems, score, detail, data)
