"""Finish reasons, mapped to one vocabulary across OpenAI, vLLM, the Responses API and
Anthropic's `stop_reason` (end_turn, stop_sequence, max_tokens, tool_use, refusal,
pause_turn, model_context_window_exceeded)."""

from __future__ import annotations

from kvmigrate.parity.context import PairContext
from kvmigrate.parity.result import ComparatorResult

_VOCABULARY = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "completed": "stop",
    "length": "length",
    "max_tokens": "length",
    "max_output_tokens": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "tool_use": "tool_calls",
    "content_filter": "content_filter",
    # A model that declines: OpenAI's filter and Anthropic's refusal stop alike.
    "refusal": "content_filter",
    # Anthropic's stop when the context window, not max_tokens, ran out.
    "model_context_window_exceeded": "length",
}


def canonical_finish(reason: str | None) -> str | None:
    if reason is None:
        return None
    return _VOCABULARY.get(reason.lower(), reason.lower())


def compare_finish(ctx: PairContext) -> ComparatorResult | None:
    primary = canonical_finish(ctx.primary_answer.finish_reason)
    candidate = canonical_finish(ctx.candidate_answer.finish_reason)
    if primary is None and candidate is None:
        return None
    agree = primary == candidate
    detail = f"{candidate} vs {primary}"
    if not agree and candidate == "stop" and ctx.candidate_answer.is_tool_answer:
        # A known vLLM quirk with tool_choice=required; agents that check finish_reason
        # instead of tool_calls break on it, so it still counts.
        detail += " (tool calls present: vLLM's `stop` with tool_choice=required)"
    data = {
        "primary": ctx.primary_answer.finish_reason,
        "candidate": ctx.candidate_answer.finish_reason,
    }
    return ComparatorResult("finish_reason", agree, 1.0 if agree else 0.0, detail, data)
