"""Tool-call agreement: the same tools, as many calls, and the same arguments.

Arguments are compared as parsed JSON (key order and spacing do not matter, 1 equals 1.0),
with agreement reported per argument. Calls are matched by name, not position, because
parallel calls may come in any order. Ids are compared by shape only: OpenAI's `call_...`,
vLLM's `chatcmpl-tool-<hex>` and Mistral's 9-character ids are all valid; a missing id is
not, since the client needs it to send the tool's result back. Nothing is ever executed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from kvmigrate.parity.answer import ToolCallView
from kvmigrate.parity.context import PairContext
from kvmigrate.parity.result import ComparatorResult

_ID_SHAPE = re.compile(r"[A-Za-z0-9_-]{9,}")
_INVALID = object()


def valid_id(call_id: str | None) -> bool:
    return call_id is not None and _ID_SHAPE.fullmatch(call_id) is not None


def parse_arguments(arguments: str) -> Any:
    """The parsed arguments; `_INVALID` when they are not JSON. Empty means no arguments."""
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except ValueError:
        return _INVALID


def _norm(value: Any) -> Any:
    """Strings compare without surrounding whitespace; containers element by element."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class CallMatch:
    name: str
    valid_json: bool
    agreement: float  # share of arguments with equal values, 1.0 when all are equal
    differing: tuple[str, ...]


def match_call(primary: ToolCallView, candidate: ToolCallView) -> CallMatch:
    if primary.free_text or candidate.free_text:  # a custom tool's input is text, not JSON
        same = primary.arguments.split() == candidate.arguments.split()
        return CallMatch(primary.name, True, 1.0 if same else 0.0, () if same else ("<input>",))
    p = parse_arguments(primary.arguments)
    c = parse_arguments(candidate.arguments)
    if c is _INVALID:
        # Broken candidate JSON counts against it even if the primary's was broken too:
        # the client cannot call the tool either way, and the two will differ anyway.
        return CallMatch(primary.name, False, 0.0, ("<invalid JSON>",))
    if p is _INVALID:
        return CallMatch(primary.name, True, 1.0, ())
    p, c = _norm(p), _norm(c)
    if not isinstance(p, dict) or not isinstance(c, dict):
        same = p == c
        return CallMatch(primary.name, True, 1.0 if same else 0.0, () if same else ("<value>",))
    keys = sorted(set(p) | set(c))
    differing = tuple(k for k in keys if p.get(k, _INVALID) != c.get(k, _INVALID))
    agreement = 1.0 - len(differing) / len(keys) if keys else 1.0
    return CallMatch(primary.name, True, agreement, differing)


def _pair_calls(
    primary: tuple[ToolCallView, ...], candidate: tuple[ToolCallView, ...]
) -> tuple[list[CallMatch], list[str], list[str]]:
    """Each primary call matched to the best unmatched candidate call of the same name;
    the names left over on either side."""
    remaining = list(candidate)
    matches, unmatched = [], []
    for call in primary:
        same = [c for c in remaining if c.name == call.name]
        if not same:
            unmatched.append(call.name)
            continue
        best = max(same, key=lambda c: match_call(call, c).agreement)
        remaining.remove(best)
        matches.append(match_call(call, best))
    return matches, unmatched, [c.name for c in remaining]


def compare_tools(ctx: PairContext) -> ComparatorResult | None:
    primary = ctx.primary_answer.tool_calls
    candidate = ctx.candidate_answer.tool_calls
    if not primary and not candidate:
        return None
    matches, missing, extra = _pair_calls(primary, candidate)
    bad_ids = [c.name for c in candidate if not valid_id(c.id)]
    ids_required = all(valid_id(c.id) for c in primary)
    problems = []
    if missing or extra:
        problems.append(f"names {[c.name for c in candidate]} vs {[c.name for c in primary]}")
    for m in matches:
        if not m.valid_json:
            problems.append(f"{m.name}: arguments are not valid JSON")
        elif m.differing:
            problems.append(f"{m.name}: arguments differ in {', '.join(m.differing[:5])}")
    if bad_ids and ids_required:
        problems.append(f"missing or malformed call ids for {', '.join(bad_ids)}")
    score = sum(0.5 + 0.5 * m.agreement for m in matches if m.valid_json)
    score /= max(len(primary), len(candidate))
    if bad_ids and ids_required:
        score *= 0.5
    data = {
        "primary_names": [c.name for c in primary],
        "candidate_names": [c.name for c in candidate],
        "arguments": [
            {
                "name": m.name,
                "valid_json": m.valid_json,
                "agreement": m.agreement,
                "differing": list(m.differing),
            }
            for m in matches
        ],
    }
    detail = "; ".join(problems) if problems else f"{len(matches)} call(s) agree"
    return ComparatorResult("tool_calls", not problems, score, detail, data)
