"""Driving conversations against one endpoint with the official `openai` client.

Every turn resends the whole history (system prompt, all earlier user messages and the
answers the server gave), as an agent does, and streams the answer with
`stream_options.include_usage`, so the last chunk carries the prompt, completion and cached
token counts. Conversations run `concurrency` at a time; the turns of one conversation run
in order, because each needs the previous answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam

from kvmigrate.bench.conversations import Conversation
from kvmigrate.config import Config

SESSION_HEADER = "X-Session-ID"  # vLLM's multi-turn benchmark and vllm-router use this key


@dataclass(frozen=True, slots=True)
class Target:
    """An OpenAI-compatible endpoint; `model` None means the first one it lists."""

    base_url: str
    model: str | None = None
    api_key: str = "EMPTY"
    label: str = ""

    @classmethod
    def candidate_of(cls, config: Config) -> Target:
        """The config's candidate backend (its first replica) and the model it serves."""
        backend = config.candidate
        served = [r.served[backend.name] for r in config.models if backend.name in r.served]
        key = backend.api_key.reveal() if backend.api_key is not None else "EMPTY"
        base = backend.direct_api_bases("bench")[0]
        return cls(base, served[0] if served else None, key, backend.name)


@dataclass(frozen=True, slots=True)
class RunSettings:
    concurrency: int = 4
    max_tokens: int = 32
    timeout_s: float = 120.0
    temperature: float | None = None


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One request. Times in seconds; token counts None when the server did not report them."""

    conversation: str
    turn: int  # 1-based
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None


@dataclass(slots=True)
class BenchRun:
    target: Target
    model: str
    records: list[TurnRecord] = field(default_factory=list)
    wall_s: float = 0.0


ProgressCallback = Callable[[TurnRecord], None]


async def resolve_model(client: openai.AsyncOpenAI, model: str | None) -> str:
    if model:
        return model
    page = await client.models.list()
    if not page.data:
        raise RuntimeError("the endpoint lists no models; pass --model")
    return page.data[0].id


async def run_bench(
    target: Target,
    conversations: Sequence[Conversation],
    settings: RunSettings,
    on_turn: ProgressCallback | None = None,
) -> BenchRun:
    """Run every conversation against `target`; `on_turn` sees each record as it lands."""
    client = openai.AsyncOpenAI(
        base_url=target.base_url,
        api_key=target.api_key,
        max_retries=0,
        timeout=settings.timeout_s,
    )
    try:
        run = BenchRun(target, await resolve_model(client, target.model))
        slots = asyncio.Semaphore(max(1, settings.concurrency))

        def record(item: TurnRecord) -> None:
            run.records.append(item)
            if on_turn is not None:
                on_turn(item)

        async def one(conversation: Conversation) -> None:
            async with slots:
                await _converse(client, run.model, conversation, settings, record)

        started = time.perf_counter()
        await asyncio.gather(*(one(c) for c in conversations))
        run.wall_s = time.perf_counter() - started
        return run
    finally:
        await client.close()


async def _converse(
    client: openai.AsyncOpenAI,
    model: str,
    conversation: Conversation,
    settings: RunSettings,
    record: ProgressCallback,
) -> None:
    messages: list[ChatCompletionMessageParam] = []
    if conversation.system:
        messages.append({"role": "system", "content": conversation.system})
    for index, user_text in enumerate(conversation.user_turns, 1):
        messages.append({"role": "user", "content": user_text})
        result, reply = await _turn(client, model, messages, conversation.id, index, settings)
        record(result)
        if result.error is not None:
            # The history would no longer match what an agent sends: skip the rest, counted.
            for later in range(index + 1, len(conversation.user_turns) + 1):
                record(TurnRecord(conversation.id, later, error="skipped"))
            return
        messages.append({"role": "assistant", "content": reply})


async def _turn(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[ChatCompletionMessageParam],
    conversation: str,
    turn: int,
    settings: RunSettings,
) -> tuple[TurnRecord, str]:
    extra: dict[str, Any] = {}
    if settings.temperature is not None:
        extra["temperature"] = settings.temperature
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    usage: Any = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=settings.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={SESSION_HEADER: conversation},
            **extra,
        )
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and first is None:
                # vLLM's benchmark definition: the first chunk with a choice. Servers send it
                # once the first token exists; its text may be empty (a role, or a token the
                # detokenizer holds back), which must not count as a slow first token.
                first = time.perf_counter()
            parts.extend(c.delta.content for c in chunk.choices if c.delta.content)
    except openai.APIError as exc:
        return TurnRecord(conversation, turn, error=_describe(exc)), ""
    finished = time.perf_counter()
    details = getattr(usage, "prompt_tokens_details", None)
    record = TurnRecord(
        conversation,
        turn,
        ttft_s=None if first is None else first - started,
        latency_s=finished - started,
        prompt_tokens=getattr(usage, "prompt_tokens", None),
        completion_tokens=getattr(usage, "completion_tokens", None),
        cached_tokens=getattr(details, "cached_tokens", None),
    )
    # Servers may answer with nothing (EOS first); a placeholder keeps the history valid.
    return record, "".join(parts) or "."


def _describe(exc: openai.APIError) -> str:
    status = getattr(exc, "status_code", None)
    return f"http {status}: {exc.message}" if status else f"{type(exc).__name__}: {exc.message}"
