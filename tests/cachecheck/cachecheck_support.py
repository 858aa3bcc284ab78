"""Planted cache busters: simulated agents, each breaking prefix caching in one known way.

`agent()` plays an agent loop: each turn it sends system + history + a new user message,
gets an answer (a text or a tool call), and appends the answer the way the agent under test
does. Hooks plant one buster each: a system prompt per turn, tools per turn, how the answer
is echoed, and an edit of the message list before sending.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvmigrate.cachecheck import BreakClass, Conversation, Turn

Message = dict[str, Any]
SYSTEM = "You are a careful coding agent. Read the repository, explain your plan, then act."
USER = [
    "Please look at the failing test in tests/test_parser.py and tell me why it fails.",
    "Now fix the parser so that quoted strings keep their inner whitespace.",
    "Run the whole suite again and summarise what changed in the output.",
    "Write a short changelog entry for this fix, in the project's usual style.",
    "Finally, check whether the documentation mentions the old behaviour anywhere.",
    "Thanks. Is there anything else in the parser that looks fragile to you?",
]


def tool(name: str, description: str = "") -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description or f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }


TOOLS = [tool("read_file"), tool("run_tests"), tool("write_file")]


def text_answer(t: int) -> Message:
    return {"role": "assistant", "content": f"Step done: I looked at part {chr(65 + t)} of it."}


def call_answer(t: int) -> Message:
    args = '{"path": "src/parser.py", "line": ' + str(10 + t) + ', "mode": "read"}'
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{t}",
                "type": "function",
                "function": {"name": "read_file", "arguments": args},
            }
        ],
    }


def exact(answer: Message, _t: int) -> list[Message]:
    """Append-only: the answer as received, plus a tool result when it called a tool."""
    out = [json.loads(json.dumps(answer))]  # a copy: echo hooks edit it, not the response
    for call in answer.get("tool_calls") or ():
        out.append({"role": "tool", "tool_call_id": call["id"], "content": "def parse(s): ..."})
    return out


@dataclass
class Agent:
    system: Callable[[int], str] = lambda t: SYSTEM
    tools: Callable[[int], list[dict[str, Any]]] = lambda t: TOOLS
    answer: Callable[[int], Message] = text_answer
    echo: Callable[[Message, int], list[Message]] = exact
    edit: Callable[[list[Message], int], list[Message]] = lambda m, t: m
    user: Callable[[int], str] = lambda t: USER[t % len(USER)]


def agent(cid: str, spec: Agent, turns: int = 5) -> Conversation:
    history: list[Message] = []
    out = []
    for t in range(turns):
        history.append({"role": "user", "content": spec.user(t)})
        history = spec.edit(history, t)
        body = {
            "model": "m",
            "messages": [{"role": "system", "content": spec.system(t)}, *history],
            "tools": spec.tools(t),
        }
        answer = spec.answer(t)
        out.append(Turn(json.loads(json.dumps(body)), {"choices": [{"message": answer}]}))
        history += spec.echo(answer, t)
    return Conversation(cid, out)


# -- the planted busters ------------------------------------------------------------------------
# Each case: (name, agent, expected class, message index of the break (None: tools), field,
# turns that break). Turns count from 1; every other turn must be clean.


def _iso(t: int) -> str:
    return f"2025-01-06T10:{31 + t:02d}:{(7 + 37 * t) % 60:02d}Z"


def _reserialise(answer: Message, t: int) -> list[Message]:
    out = exact(answer, t)
    for call in out[0].get("tool_calls") or ():
        call["function"] = dict(call["function"])
        call["function"]["arguments"] = json.dumps(
            json.loads(call["function"]["arguments"]), sort_keys=True
        )
    return out


def _reserialise_compact(answer: Message, t: int) -> list[Message]:
    out = exact(answer, t)
    for call in out[0].get("tool_calls") or ():
        call["function"] = dict(call["function"])
        call["function"]["arguments"] = json.dumps(
            json.loads(call["function"]["arguments"]), separators=(",", ":")
        )
    return out


def _strip(answer: Message, t: int) -> list[Message]:
    return [{**answer, "content": (answer["content"] or "").strip()}]


def _trailing_answer(t: int) -> Message:
    return {"role": "assistant", "content": f"Here is part {chr(65 + t)} of the plan.\n\n"}


def _edit_at(
    turn: int, index: int, change: Callable[[str], str]
) -> Callable[[list[Message], int], list[Message]]:
    def edit(messages: list[Message], t: int) -> list[Message]:
        if t == turn:
            messages = [dict(m) for m in messages]
            messages[index]["content"] = change(messages[index]["content"])
        return messages

    return edit


def _window(keep: int, at: int) -> Callable[[list[Message], int], list[Message]]:
    def edit(messages: list[Message], t: int) -> list[Message]:
        return messages[-keep:] if t == at else messages

    return edit


def _summarise(at: int) -> Callable[[list[Message], int], list[Message]]:
    def edit(messages: list[Message], t: int) -> list[Message]:
        if t != at:
            return messages
        summary = {
            "role": "user",
            "content": "Summary of the conversation so far: parser bug found.",
        }
        return [summary, *messages[-3:]]

    return edit


def _breakpoint_on(
    pick: Callable[[int, int], int],
) -> Callable[[list[Message], int], list[Message]]:
    """`cache_control` on the text block of one user message, history index `pick(t, n)`
    (a chat body carries breakpoints for gateways that pass them on to Anthropic)."""

    def edit(messages: list[Message], t: int) -> list[Message]:
        chosen, out = pick(t, len(messages)), []
        for i, message in enumerate(messages):
            if message["role"] != "user":
                out.append(message)
                continue
            content = message["content"]
            text = content if isinstance(content, str) else content[0]["text"]
            block: dict[str, Any] = {"type": "text", "text": text}
            if i == chosen:
                block["cache_control"] = {"type": "ephemeral"}
            out.append({**message, "content": [block]})
        return out

    return edit


ALL = range(2, 6)
S = BreakClass


def text_answer_at(turn: int) -> int:
    """Index of the answer echoed last, in turn `turn`: [system, u, a, u, a, ...]."""
    return 2 * (turn - 1)


def call_answer_at(turn: int) -> int:
    """The same with tool calls: [system, u, a, tool, u, a, tool, ...]."""
    return 3 * turn - 4


PLANTED: list[
    tuple[str, Agent, BreakClass, int | Callable[[int], int] | None, str, range | list[int]]
] = [
    # timestamps and dates
    (
        "iso-time-in-system",
        Agent(system=lambda t: f"Current time: {_iso(t)}\n{SYSTEM}"),
        S.TIMESTAMP,
        0,
        "content",
        ALL,
    ),
    (
        "date-in-system",
        Agent(
            system=lambda t: (
                f"{SYSTEM}\nToday is {['Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday'][t]}, January {6 + t}, 2025."
            )
        ),
        S.TIMESTAMP,
        0,
        "content",
        ALL,
    ),
    (
        "epoch-in-system",
        Agent(system=lambda t: f"{SYSTEM} now={1736159467 + 61 * t}"),
        S.TIMESTAMP,
        0,
        "content",
        ALL,
    ),
    (
        "clock-in-system",
        Agent(system=lambda t: f"Local time: {9 + t}:{15 + t} AM. {SYSTEM}"),
        S.TIMESTAMP,
        0,
        "content",
        ALL,
    ),
    (
        "iso-time-same-answers",
        Agent(
            system=lambda t: f"Current time: {_iso(t)}\n{SYSTEM}",
            answer=lambda t: {"role": "assistant", "content": "ok"},
        ),
        S.TIMESTAMP,
        0,
        "content",
        ALL,
    ),
    (
        "time-in-first-user-message",
        Agent(edit=lambda m, t: [{**m[0], "content": f"[{_iso(t)}] {USER[0]}"}, *m[1:]]),
        S.TIMESTAMP,
        1,
        "content",
        ALL,
    ),
    # uuids and request ids
    (
        "uuid-in-system",
        Agent(system=lambda t: f"Session {uuid.UUID(int=t * 7919 + 12345)}. {SYSTEM}"),
        S.REQUEST_ID,
        0,
        "content",
        ALL,
    ),
    (
        "request-id-in-system",
        Agent(system=lambda t: f"{SYSTEM}\nRequest-ID: req_{(t + 1) * 982451653:x}abc"),
        S.REQUEST_ID,
        0,
        "content",
        ALL,
    ),
    (
        "trace-hex-in-system",
        Agent(
            system=lambda t: f"trace_id={uuid.UUID(int=(t + 99) * 0x9E3779B97F4A7C15).hex} {SYSTEM}"
        ),
        S.REQUEST_ID,
        0,
        "content",
        ALL,
    ),
    # counters
    (
        "turn-counter",
        Agent(system=lambda t: f"{SYSTEM} This is turn {t + 1}."),
        S.COUNTER,
        0,
        "content",
        ALL,
    ),
    (
        "budget-counter",
        Agent(system=lambda t: f"You have used {t * 3} of 50 tool calls. {SYSTEM}"),
        S.COUNTER,
        0,
        "content",
        ALL,
    ),
    (
        "message-count",
        Agent(system=lambda t: f"{SYSTEM}\nMessages so far: {2 * t + 1}"),
        S.COUNTER,
        0,
        "content",
        ALL,
    ),
    # changed system prompt
    (
        "memory-in-system",
        Agent(
            system=lambda t: (
                f"{SYSTEM}\nMemory: {['user likes tabs', 'user prefers spaces', 'project uses black', 'tests run with pytest', 'ci is slow'][t]}"
            )
        ),
        S.SYSTEM_PROMPT,
        0,
        "content",
        ALL,
    ),
    (
        "system-rewritten-once",
        Agent(system=lambda t: SYSTEM if t < 3 else SYSTEM.replace("careful", "fast")),
        S.SYSTEM_PROMPT,
        0,
        "content",
        [4],
    ),
    # tools
    (
        "tools-rotated",
        Agent(tools=lambda t: TOOLS[t % 3 :] + TOOLS[: t % 3]),
        S.TOOLS_REORDERED,
        None,
        "tools[0]",
        [2, 3, 4, 5],
    ),
    (
        "tools-shuffled-once",
        Agent(tools=lambda t: TOOLS if t != 2 else [TOOLS[0], TOOLS[2], TOOLS[1]]),
        S.TOOLS_REORDERED,
        None,
        "tools[1]",
        [3, 4],
    ),
    (
        "tool-keys-reordered",
        Agent(
            tools=lambda t: (
                TOOLS
                if t < 2
                else [{"function": TOOLS[0]["function"], "type": "function"}, *TOOLS[1:]]
            )
        ),
        S.TOOLS_REORDERED,
        None,
        "tools[0]",
        [3],
    ),
    (
        "tool-added",
        Agent(tools=lambda t: TOOLS if t < 3 else [*TOOLS[:2], tool("grep"), TOOLS[2]]),
        S.TOOLS_CHANGED,
        None,
        "tools[2]",
        [4],
    ),
    (
        "tool-description-changed",
        Agent(
            tools=lambda t: TOOLS if t != 1 else [tool("read_file", "Read one file."), *TOOLS[1:]]
        ),
        S.TOOLS_CHANGED,
        None,
        "tools[0]",
        [2, 3],
    ),
    # tool-call arguments re-serialised
    (
        "args-sorted",
        Agent(answer=call_answer, echo=_reserialise),
        S.TOOL_ARGS,
        call_answer_at,
        "tool_calls[0].function.arguments",
        ALL,
    ),
    (
        "args-compact",
        Agent(answer=call_answer, echo=_reserialise_compact),
        S.TOOL_ARGS,
        call_answer_at,
        "tool_calls[0].function.arguments",
        ALL,
    ),
    # edited earlier messages
    (
        "typo-fixed",
        Agent(edit=_edit_at(3, 0, lambda c: c.replace("failing", "broken"))),
        S.EDITED,
        1,
        "content",
        [4],
    ),
    (
        "answer-rewritten",
        Agent(edit=_edit_at(2, 1, lambda c: "I looked into it.")),
        S.EDITED,
        2,
        "content",
        [3],
    ),
    (
        "message-inserted",
        Agent(
            edit=lambda m, t: (
                m if t != 2 else [m[0], {"role": "user", "content": "Reminder: be brief."}, *m[1:]]
            )
        ),
        S.EDITED,
        2,
        "role",
        [3],
    ),
    # deliberate truncation and summaries
    ("sliding-window", Agent(edit=_window(3, 3)), S.TRUNCATED, 1, "messages", [4]),
    ("summarised", Agent(edit=_summarise(3)), S.TRUNCATED, 1, "messages", [4]),
    # whitespace
    (
        "answer-stripped",
        Agent(answer=_trailing_answer, echo=_strip),
        S.WHITESPACE,
        text_answer_at,
        "content",
        ALL,
    ),
    (
        "spaces-collapsed",
        Agent(edit=_edit_at(2, 0, lambda c: c.replace(" in ", "  in "))),
        S.WHITESPACE,
        1,
        "content",
        [3],
    ),
    # Anthropic's cache breakpoint moved back to the first user message on the third turn:
    # the prompt stays append-only, but the hosted cache stops at message 1.
    (
        "cache-breakpoint-moved-back",
        Agent(edit=_breakpoint_on(lambda t, n: 0 if t == 2 else n - 1)),
        S.CACHE_BREAKPOINT,
        1,
        "cache_control",
        [3],
    ),
]


CLEAN: list[tuple[str, Agent]] = [
    # The same answer every turn (a tiny model at temperature 0 does this): repeats must not
    # look like a history that was cut.
    ("same-answer-every-turn", Agent(answer=lambda t: {"role": "assistant", "content": "ok"})),
    ("plain", Agent()),
    ("tool-calls-echoed", Agent(answer=call_answer)),
    ("no-tools", Agent(tools=lambda t: [])),
    ("repeated-user-text", Agent(user=lambda t: "go on")),
    # The fix for a timestamp: the current time moves to the latest user message.
    ("time-in-latest-user-message", Agent(user=lambda t: f"Current time: {_iso(t)}\n{USER[t]}")),
    ("answer-with-trailing-space-echoed", Agent(answer=_trailing_answer)),
    # Anthropic's advice: the breakpoint on the newest message, moving forward every turn.
    ("cache-breakpoint-moves-forward", Agent(edit=_breakpoint_on(lambda t, n: n - 1))),
]
