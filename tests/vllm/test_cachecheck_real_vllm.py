"""A timestamp at the top of the system prompt defeats vLLM's prefix cache; the fix that
`cachecheck` suggests (move it to the latest user message) restores it. Real engine, real
`cached_tokens`, and the detector's verdict on both conversations."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from kvmigrate.cachecheck import BreakClass, Conversation, TokenCounter, Turn, check_conversation
from kvmigrate.testbed.vllm_server import VllmServer

pytestmark = pytest.mark.vllm

BLOCK = 32  # --block-size of the test bed: cached tokens come in whole blocks
TURNS = 4
RULES = (
    "Read the repository before you change it. Explain the plan in two sentences. "
    "Prefer small patches over rewrites, keep the public interface stable, run the tests "
    "after each change and report what failed with the exact error message. "
)
TASKS = [
    "Look at the failing test in tests/test_parser.py and tell me why it fails today.",
    "Now fix the parser so that quoted strings keep their inner whitespace intact.",
    "Run the whole suite again and summarise what changed in the output for me.",
    "Write a short changelog entry for this fix in the usual style of the project.",
]


@pytest.fixture(scope="module")
def client(real_vllm: VllmServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=real_vllm.base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


def converse(
    client: openai.OpenAI, system: Callable[[str], str], user: Callable[[str, str], str]
) -> tuple[list[int], list[int], Conversation]:
    """Play an append-only agent for TURNS turns; the clock advances 41 s a turn."""
    start = dt.datetime.now(dt.UTC).replace(microsecond=0)
    history: list[dict[str, Any]] = []
    cached, prompt, turns = [], [], []
    for t in range(TURNS):
        now = (start + dt.timedelta(seconds=41 * t)).isoformat()
        history.append({"role": "user", "content": user(now, TASKS[t])})
        messages = [{"role": "system", "content": system(now)}, *history]
        reply = client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=8,
            temperature=0,  # type: ignore[arg-type]
        )
        usage = reply.usage
        assert usage is not None
        assert usage.prompt_tokens_details is not None
        cached.append(usage.prompt_tokens_details.cached_tokens or 0)
        prompt.append(usage.prompt_tokens)
        answer = {"role": "assistant", "content": reply.choices[0].message.content or ""}
        turns.append(Turn({"messages": messages}, {"choices": [{"message": answer}]}))
        history.append(answer)
    return cached, prompt, Conversation("c", turns)


def test_timestamp_in_system_prompt_busts_the_cache_and_the_fix_restores_it(
    client: openai.OpenAI,
) -> None:
    nonce = uuid.uuid4().hex  # no other test (or earlier run) shares these prefixes
    busted, busted_prompt, before = converse(
        client,
        lambda now: f"Current time: {now}\nYou are coding agent {nonce}a. {RULES * 3}",
        lambda now, task: task,
    )
    fixed, fixed_prompt, after = converse(
        client,
        lambda now: f"You are coding agent {nonce}b. {RULES * 3}",
        lambda now, task: f"Current time: {now}\n{task}",
    )
    print(f"\ntimestamp in system prompt: prompt {busted_prompt}, cached {busted}")
    print(f"timestamp in latest user message: prompt {fixed_prompt}, cached {fixed}")

    # The detector names the cause and the fix, and finds nothing wrong after it.
    checks = check_conversation(before, TokenCounter())
    breaks = [c.brk for c in checks[1:]]
    assert all(b is not None and b.cls is BreakClass.TIMESTAMP for b in breaks), breaks
    assert breaks[0] is not None
    assert breaks[0].fix.startswith(
        "move `Current time:` from the system prompt to the latest user message"
    )
    assert "`X-Session-ID`" in breaks[0].fix
    assert all(c.brk is None and c.ratio == 1.0 for c in check_conversation(after, TokenCounter()))

    # The prompts are several blocks long, so the contrast is not a rounding effect.
    assert min(busted_prompt) > 8 * BLOCK
    # With the timestamp on top, later turns share at most the first block or so.
    assert all(c <= BLOCK for c in busted[1:])
    # Moved to the latest user message: each turn reuses all of the previous prompt but the
    # last, partly filled block.
    for t in range(1, TURNS):
        assert fixed[t] >= fixed_prompt[t - 1] - BLOCK
        assert fixed[t] >= 0.6 * fixed_prompt[t]
