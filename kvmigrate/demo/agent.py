"""A small coding agent that talks through the proxy like real agents do.

Every turn resends the whole history (a long system prompt, tool definitions, earlier
answers and tool results), calls tools when the model asks for them, and streams every
answer, as agents do. That is the traffic prefix caching pays off for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import openai

SYSTEM_PROMPT = (
    "You are a careful coding agent working in a large Python repository. "
    "Read before you write, run the tests after every change, and explain each step. "
) * 40
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the test suite, or one test file.",
            "parameters": {
                "type": "object",
                "properties": {"target": {"type": "string"}},
                "required": ["target"],
            },
        },
    },
]
TASKS = [
    "The checkout service times out under load; find out why.",
    "Add retries with backoff to the payment client.",
    "The nightly export job writes duplicate rows; fix it.",
    "Upgrade the ORM and fix whatever breaks.",
    "Make the search endpoint return results in under 200 ms.",
    "Find the memory leak in the websocket gateway.",
]


async def run_conversation(
    client: openai.AsyncOpenAI, model: str, index: int, turns: int, max_tokens: int = 48
) -> int:
    """One agent conversation of `turns` model calls; returns how many calls failed."""
    messages: list[dict[str, Any]] = [
        # Each agent works on its own project, so turn 1 finds nothing cached: what the
        # later turns gain is the conversation's own history.
        {"role": "system", "content": f"Project {index}. {SYSTEM_PROMPT}"},
        {"role": "user", "content": f"Task {index}: {TASKS[index % len(TASKS)]}"},
    ]
    failures = 0
    waits: list[float] = []
    for turn in range(turns):
        try:
            started = time.monotonic()
            message = await _ask(
                client,
                model,
                messages,
                max_tokens=max_tokens,
                session=f"demo-{index}",
            )
            waits.append(time.monotonic() - started)
        except openai.APIError:
            failures += 1
            messages.append({"role": "user", "content": "That failed; try again."})
            continue
        messages.append(message)
        for call in message.get("tool_calls") or ():
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": tool_result(call["function"]["name"], turn),
                }
            )
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": "Good. What is the next step?"})
    await _rate(client, f"demo-{index}", waits, random.Random(index))
    return failures


async def _rate(
    client: openai.AsyncOpenAI, session: str, waits: list[float], rng: random.Random
) -> None:
    """The emulated user scores the conversation, 1 to 5, as POST /v1/feedback takes it:
    the longer each answer took, the lower, with a person's noise around it."""
    if not waits:
        return
    mean_wait = sum(waits) / len(waits)
    score = min(5.0, max(1.0, round(5.0 - 2.0 * mean_wait + rng.gauss(0.0, 0.5), 1)))
    with contextlib.suppress(openai.APIError):
        await client.post(
            "/feedback",
            body={"conversation_id": session, "name": "satisfaction", "value": score},
            cast_to=object,
        )


async def _ask(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    session: str,
) -> dict[str, Any]:
    headers = {"X-Session-ID": session}
    content: list[str] = []
    # Each call's id, name pieces and argument pieces, joined once the stream ends.
    calls: dict[int, tuple[list[str], list[str], list[str]]] = {}
    chunks = await client.chat.completions.create(
        model=model,
        messages=cast(Any, messages),
        tools=cast(Any, TOOLS),
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers,
    )
    async for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        for part in delta.tool_calls or ():
            ids, names, arguments = calls.setdefault(part.index, ([], [], []))
            if part.id:
                ids.append(part.id)
            if part.function is not None:
                names.append(part.function.name or "")
                arguments.append(part.function.arguments or "")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [_call(*calls[i]) for i in sorted(calls)]
    return message


def _call(ids: list[str], names: list[str], arguments: list[str]) -> dict[str, Any]:
    function = {"name": "".join(names), "arguments": "".join(arguments)}
    return {"id": ids[-1] if ids else "", "type": "function", "function": function}


def tool_result(name: str, turn: int) -> str:
    if name == "run_tests":
        return json.dumps({"passed": 212 + turn, "failed": max(0, 3 - turn)})
    return "def handler(request):\n    return service.process(request, timeout=30)\n" * 12


async def drive(
    base_url: str,
    model: str,
    conversations: int,
    turns: int,
    concurrency: int,
    progress: Callable[[int], None] = lambda _n: None,
    first_index: int = 0,
) -> int:
    """Run `conversations` agents, `concurrency` at a time; returns the failed calls."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-demo", max_retries=0) as client:
        return await run_agents(
            lambda index: run_conversation(client, model, index, turns),
            range(first_index, first_index + conversations),
            concurrency,
            progress,
        )


async def run_agents(
    conversation: Callable[[int], Awaitable[int]],
    indexes: range,
    concurrency: int,
    progress: Callable[[int], None],
) -> int:
    """Run one `conversation` per index, `concurrency` at a time; the failed calls in all."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(index: int) -> int:
        async with semaphore:
            failed = await conversation(index)
        progress(1)
        return failed

    return sum(await asyncio.gather(*(one(i) for i in indexes)))
