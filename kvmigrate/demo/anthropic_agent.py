"""The demo's coding agent on Anthropic's Messages API, as agents built on the anthropic SDK
talk: the system prompt marked for caching, one moving `cache_control` breakpoint on the
newest message (as Claude Code places it), tool results answered in the next user turn,
every answer streamed. Same tasks, prompt and tool results as `demo.agent`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvmigrate.demo.agent import SYSTEM_PROMPT, TASKS, TOOLS, run_agents, tool_result

CACHE = {"type": "ephemeral"}
# The chat tools in the Messages API's shape.
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]


async def run_conversation(
    client: Any, model: str, index: int, turns: int, max_tokens: int = 48
) -> int:
    """One agent conversation of `turns` model calls; returns how many calls failed."""
    import anthropic

    system = [{"type": "text", "text": f"Project {index}. {SYSTEM_PROMPT}", "cache_control": CACHE}]
    task = f"Task {index}: {TASKS[index % len(TASKS)]}"
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task}]}]
    failures = 0
    for turn in range(turns):
        try:
            async with client.messages.stream(
                model=model,
                max_tokens=max_tokens,
                system=system,
                tools=ANTHROPIC_TOOLS,
                messages=with_breakpoint(messages),
                extra_headers={"X-Session-ID": f"demo-{index}"},
            ) as stream:
                message = await stream.get_final_message()
        except anthropic.APIError:
            failures += 1
            messages.append({"role": "user", "content": [{"type": "text", "text": "Try again."}]})
            continue
        content = [block.model_dump(exclude_none=True) for block in message.content]
        messages.append({"role": "assistant", "content": content})
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": tool_result(b["name"], turn)}
            for b in content
            if b["type"] == "tool_use"
        ]
        next_step = [{"type": "text", "text": "Good. What is the next step?"}]
        messages.append({"role": "user", "content": results or next_step})
    return failures


def with_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history with a cache breakpoint on the newest message's last block only."""
    *earlier, last = messages
    blocks = [*last["content"][:-1], {**last["content"][-1], "cache_control": CACHE}]
    return [*earlier, {**last, "content": blocks}]


async def drive(
    base_url: str,
    model: str,
    conversations: int,
    turns: int,
    concurrency: int,
    progress: Callable[[int], None] = lambda _n: None,
    first_index: int = 0,
) -> int:
    """Run `conversations` agents, `concurrency` at a time; returns the failed calls.
    `base_url` is the proxy's root, as ANTHROPIC_BASE_URL is."""
    import anthropic

    async with anthropic.AsyncAnthropic(
        base_url=base_url, api_key="sk-ant-demo", max_retries=0
    ) as client:
        return await run_agents(
            lambda index: run_conversation(client, model, index, turns),
            range(first_index, first_index + conversations),
            concurrency,
            progress,
        )
