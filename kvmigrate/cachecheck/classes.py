"""The kinds of prefix-cache break, and the fix for each."""

from __future__ import annotations

from enum import StrEnum


class BreakClass(StrEnum):
    TIMESTAMP = "timestamp"
    REQUEST_ID = "request_id"
    COUNTER = "counter"
    SYSTEM_PROMPT = "system_prompt_changed"
    TOOLS_REORDERED = "tools_reordered"
    TOOLS_CHANGED = "tools_changed"
    TOOL_ARGS = "tool_args_reserialised"
    EDITED = "edited_message"
    TRUNCATED = "history_truncated"
    WHITESPACE = "whitespace"
    CACHE_BREAKPOINT = "cache_breakpoint_moved_back"


# Truncating or summarising history is a choice the agent makes to fit its context window:
# reported with its cost, but not counted as a bug.
DELIBERATE = frozenset({BreakClass.TRUNCATED})

DESCRIPTIONS: dict[BreakClass, str] = {
    BreakClass.TIMESTAMP: "a timestamp or date that changes every turn",
    BreakClass.REQUEST_ID: "a uuid or request id that changes every turn",
    BreakClass.COUNTER: "a counter (turn, step, message count) that changes every turn",
    BreakClass.SYSTEM_PROMPT: "the system prompt changed",
    BreakClass.TOOLS_REORDERED: "the same tools, listed or serialised in another order",
    BreakClass.TOOLS_CHANGED: "the tool list changed",
    BreakClass.TOOL_ARGS: "tool-call arguments re-serialised (JSON-equal, bytes differ)",
    BreakClass.EDITED: "an earlier message was edited, inserted or removed",
    BreakClass.TRUNCATED: "history truncated or summarised (deliberate)",
    BreakClass.WHITESPACE: "whitespace changed in an earlier message",
    BreakClass.CACHE_BREAKPOINT: (
        "Anthropic's cache_control breakpoint moved back or was dropped: hosted Anthropic "
        "caches only up to it (a self-hosted engine caches regardless)"
    ),
}


def fix_for(cls: BreakClass, label: str, role: str, field: str) -> str:
    """A concrete fix. `label` is the text that introduces a changing value (`Current time:`)."""
    fix = _fix(cls, label, role)
    if cls in _STICKINESS_BREAKERS and role in ("system", "developer"):
        return fix + STICKINESS_NOTE
    return fix


# A system prompt that changes every turn also hides which conversation a request belongs to
# when the client sends no session id: the proxy then keys it by continuity or by a guess.
STICKINESS_NOTE = (
    "; the same changing prompt also weakens conversation stickiness (turns of one "
    "conversation can reach different backends): send an `X-Session-ID` header per "
    "conversation"
)
_STICKINESS_BREAKERS = frozenset(
    {BreakClass.TIMESTAMP, BreakClass.REQUEST_ID, BreakClass.COUNTER, BreakClass.SYSTEM_PROMPT}
)


def _fix(cls: BreakClass, label: str, role: str) -> str:
    name = f"`{label}`" if label else "the changing value"
    where = "the system prompt" if role in ("system", "developer") else "earlier messages"
    if cls is BreakClass.TIMESTAMP:
        if where == "the system prompt":
            return f"move {name} from the system prompt to the latest user message"
        return (
            f"keep {name} in earlier messages as first sent; put the current time in the "
            "latest user message"
        )
    if cls is BreakClass.REQUEST_ID:
        return (
            f"remove {name} from {where}; send request ids as a header (X-Request-ID) or in "
            "`metadata`, never in the prompt"
        )
    if cls is BreakClass.COUNTER:
        return f"remove {name} from {where}, or state it only in the latest user message"
    return _FIXES[cls]


_FIXES: dict[BreakClass, str] = {
    BreakClass.SYSTEM_PROMPT: (
        "keep the system prompt byte-identical for the whole conversation; move per-turn "
        "context (memory, retrieved documents, state) into the latest user message"
    ),
    BreakClass.TOOLS_REORDERED: (
        "sort tools by name and build each schema with a fixed key order before every request"
    ),
    BreakClass.TOOLS_CHANGED: (
        "send the same tool list on every turn; restrict which tools may be called with "
        "`tool_choice` rather than by adding or removing tools"
    ),
    BreakClass.TOOL_ARGS: (
        "send tool-call arguments back exactly as received: keep the `arguments` string, "
        "do not parse and re-dump it"
    ),
    BreakClass.EDITED: (
        "never rewrite earlier messages; append a correction or new context as a new message"
    ),
    BreakClass.TRUNCATED: (
        "deliberate: trim in large steps only near the context limit (e.g. drop half the "
        "history at once) so most turns stay append-only"
    ),
    BreakClass.WHITESPACE: (
        "send earlier messages back byte for byte: no strip() or whitespace normalisation, "
        "in particular of the assistant's answers"
    ),
    BreakClass.CACHE_BREAKPOINT: (
        "put `cache_control` on the last block of the newest message every turn (it may "
        "move forward, never back), and keep the one on the system prompt or tools"
    ),
}
