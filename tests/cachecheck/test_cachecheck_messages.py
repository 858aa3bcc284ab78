"""The cache-buster detector on Anthropic Messages traffic: a timestamp in `system` (a
string or a list of blocks), tools in another order, and `cache_control` breakpoints that
move forward (clean) or back (a hosted-cache break); offline over conversations, and online
over exchanges carrying streamed Messages answers as the proxy records them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import messages_wire as mw
import pytest

from kvmigrate.cachecheck import BreakClass, Conversation, TokenCounter, Turn, check_conversation
from kvmigrate.cachecheck.addon import CacheBusterAddon
from kvmigrate.exchange import Exchange, Role

SYSTEM = "You are a careful coding agent. Read the repository, explain your plan, then act."
USERS = [
    "Look at the failing test in tests/test_parser.py and say why it fails.",
    "Now fix the parser so that quoted strings keep their inner whitespace.",
    "Run the whole suite again and summarise what changed.",
    "Write a short changelog entry for this fix.",
]
READ = {
    "name": "read_file",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}
RUN = {
    "name": "run_tests",
    "description": "Run the tests",
    "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}},
}
EPHEMERAL = {"type": "ephemeral"}
Body = dict[str, Any]


def _answer(t: int) -> dict[str, Any]:
    """A text and a tool call every turn, as a coding agent's answers go."""
    return mw.message(
        [
            mw.text(f"Step {t}: reading the parser."),
            mw.tool_use(
                "read_file", {"path": "src/parser.py", "line": 10 + t}, f"toolu_01Ab{t:06d}"
            ),
        ],
        stop_reason="tool_use",
    )


def _conversation(
    system: Callable[[int], Any] = lambda t: SYSTEM,
    tools: Callable[[int], list[Body]] = lambda t: [READ, RUN],
    mark: Callable[[int, int], int | None] = lambda t, n: n - 1,
    turns: int = 4,
) -> tuple[list[Body], list[Body]]:
    """(request bodies, answers) of an Anthropic SDK agent loop: each answer's content is
    sent back as it came, its tool call answered by a `tool_result`, and `cache_control`
    put on the last block of user message `mark(t, n)` (None: nowhere)."""
    history: list[Body] = []
    bodies, answers = [], []
    for t in range(turns):
        history.append({"role": "user", "content": [{"type": "text", "text": USERS[t]}]})
        chosen = mark(t, len(history))
        sent = [
            {**m, "content": [{**m["content"][-1], "cache_control": EPHEMERAL}]}
            if i == chosen and m["role"] == "user" and len(m["content"]) == 1
            else m
            for i, m in enumerate(history)
        ]
        bodies.append(mw.request(sent, system=system(t), tools=tools(t)))
        answer = _answer(t)
        answers.append(answer)
        call = answer["content"][1]
        history += [
            {"role": "assistant", "content": answer["content"]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call["id"],
                        "content": "def parse(s): ...",
                    },
                    {"type": "text", "text": "Here it is."},
                ],
            },
        ]
    return bodies, answers


def _offline(bodies: list[Body], answers: list[Body]) -> list[Any]:
    turns = [Turn(b, a) for b, a in zip(bodies, answers, strict=True)]
    return check_conversation(Conversation("c1", turns), TokenCounter())


def _stamped(t: int) -> str:
    return f"{SYSTEM}\nCurrent time: 2026-12-01T10:{10 + t:02d}:07Z"


def test_an_append_only_agent_with_a_forward_moving_breakpoint_is_clean() -> None:
    checks = _offline(*_conversation())
    assert [c.brk for c in checks] == [None] * 4
    assert all(c.ratio == 1.0 for c in checks)
    assert checks[-1].expected_tokens > 0


@pytest.mark.parametrize(
    "system",
    [
        _stamped,
        lambda t: [
            {"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL},
            {"type": "text", "text": _stamped(t).removeprefix(SYSTEM)},
        ],
    ],
    ids=["string", "blocks"],
)
def test_a_timestamp_in_system_is_a_timestamp_break_in_the_system_prompt(
    system: Callable[[int], Any],
) -> None:
    checks = _offline(*_conversation(system=system))
    for check in checks[1:]:
        assert check.brk is not None
        assert check.brk.cls is BreakClass.TIMESTAMP
        assert (check.brk.location.message, check.brk.location.role) == (0, "system")
        assert check.brk.label == "Current time:"
        assert check.tokens_lost > 0


def test_tools_in_another_order_are_tools_reordered_with_their_names() -> None:
    checks = _offline(*_conversation(tools=lambda t: [READ, RUN] if t < 2 else [RUN, READ]))
    assert [c.brk.cls if c.brk else None for c in checks] == [
        None, None, BreakClass.TOOLS_REORDERED, None
    ]  # fmt: skip
    brk = checks[2].brk
    assert brk is not None
    assert "[read_file, run_tests] -> [run_tests, read_file]" in brk.detail


def test_a_tool_marked_as_the_breakpoint_is_no_change_of_the_tools() -> None:
    marked = {**RUN, "cache_control": EPHEMERAL}
    checks = _offline(*_conversation(tools=lambda t: [READ, marked] if t % 2 else [READ, RUN]))
    assert all(c.brk is None or c.brk.cls is BreakClass.CACHE_BREAKPOINT for c in checks)
    assert not any(c.brk and c.brk.cls.startswith("tools") for c in checks)


@pytest.mark.parametrize(
    ("mark", "where"),
    [(lambda t, n: 0 if t == 2 else n - 1, 1), (lambda t, n: None if t == 2 else n - 1, None)],
    ids=["moved-back", "dropped"],
)
def test_a_breakpoint_moved_back_or_dropped_is_a_hosted_cache_break(
    mark: Callable[[int, int], int | None], where: int | None
) -> None:
    checks = _offline(*_conversation(mark=mark))
    assert [c.brk.cls if c.brk else None for c in checks] == [
        None, None, BreakClass.CACHE_BREAKPOINT, None
    ]  # fmt: skip
    brk, check = checks[2].brk, checks[2]
    assert brk is not None
    assert (brk.location.message, brk.location.field) == (where, "cache_control")
    assert 0 < check.tokens_lost < check.expected_tokens
    assert "hosted Anthropic" in brk.detail
    assert "cache_control" in brk.fix


def _exchange(body: Body, answer: Body, turn: int) -> Exchange:
    now = time.perf_counter()
    x = Exchange(
        request_id=f"r{turn}",
        route="messages",
        backend="anthropic",
        role=Role.SERVE,
        model=mw.MODEL,
        served_model=mw.MODEL,
        conversation="session-1",
        turn=turn,
        stream=True,
        started=now,
        request_body=mw.body({**body, "stream": True}),
        status=200,
        first_byte=now,
        finished=now,
    )
    x.chunks.extend(mw.chunks(mw.stream(answer), 61))
    return x


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_online_the_detector_reads_streamed_messages_answers(worker: str) -> None:
    """The answer an agent sends back comes from the reassembled stream: a clean agent
    breaks nothing, and a stamped system prompt breaks every later turn."""
    addon = CacheBusterAddon(worker=worker)
    addon.start()
    try:
        for conversation, stamped in (("clean", False), ("stamped", True)):
            bodies, answers = _conversation(system=_stamped if stamped else lambda t: SYSTEM)
            for t, (body, answer) in enumerate(zip(bodies, answers, strict=True), start=1):
                x = _exchange(body, answer, t)
                x.conversation = conversation
                addon.exchange_done(x)
        assert addon.wait_idle(30)
    finally:
        addon.close()
    found = {(r.conversation, r.check.turn): r.check for r in addon.results}
    assert len(found) == 8
    for turn in range(2, 5):
        assert found["clean", turn].brk is None
        assert found["clean", turn].ratio == 1.0
        # What the cache can reuse includes the previous answer, read from its stream.
        assert found["clean", turn].expected_tokens > found["clean", turn - 1].prompt_tokens
        brk = found["stamped", turn].brk
        assert brk is not None
        assert brk.cls is BreakClass.TIMESTAMP
