"""Driving conversations against one endpoint with the official `openai` client.

Every turn resends the whole history (system prompt, all earlier user messages and the
answers the server gave), as an agent does, and streams the answer with
`stream_options.include_usage`, so the last chunk carries the prompt, completion and cached
token counts. Conversations run `concurrency` at a time; the turns of one conversation run
in order, because each needs the previous answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from openai.types.chat import ChatCompletionMessageParam

from kvmigrate.bench.conversations import Conversation
from kvmigrate.config import Config, safe_text, safe_url

SESSION_HEADER = "X-Session-ID"  # vLLM's multi-turn benchmark and vllm-router use this key

# The most of one answer the bench reads: a 32-token answer streams a few KiB, and a server
# that sends an endless body would otherwise fill this machine's memory.
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise httpx2.ReadError(f"the answer passed {self._limit:,} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedTransport(httpx2.AsyncHTTPTransport):
    """Every answer's body ends in an error past MAX_ANSWER_BYTES."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        response.stream = _CappedStream(response.stream, MAX_ANSWER_BYTES)
        return response


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
    # Read raw and parse here: the SDK's own parsing of an answer that is no model list
    # (an HTML page) raises an AttributeError from deep inside it.
    raw = await client.models.with_raw_response.list()
    try:
        cards = json.loads(raw.text).get("data")
        first = cards[0]["id"]
    except (ValueError, AttributeError, TypeError, LookupError):
        raise RuntimeError(
            f"GET {safe_url(str(client.base_url))}models answered no OpenAI model list; pass "
            "--model, "
            "or check that the URL is an OpenAI-compatible endpoint ending in /v1"
        ) from None
    return str(first)


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
        http_client=openai.DefaultAsyncHttpxClient(transport=_CappedTransport()),
    )
    try:
        try:
            # The client's timeout bounds each read, not the whole answer: a server that
            # trickles bytes would never time out without this one.
            async with asyncio.timeout(settings.timeout_s):
                model = await resolve_model(client, target.model)
        except TimeoutError:
            raise RuntimeError(
                f"GET {safe_url(str(client.base_url))}models did not answer within "
                f"{settings.timeout_s:g} s"
            ) from None
        run = BenchRun(target, model)
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


@dataclass(slots=True)
class _Streamed:
    first: float | None = None  # when the first chunk with a choice came
    chunks: int = 0
    parts: list[str] = field(default_factory=list)
    usage: Any = None


async def _stream(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[ChatCompletionMessageParam],
    conversation: str,
    settings: RunSettings,
    extra: dict[str, Any],
) -> _Streamed:
    got = _Streamed()
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
        got.chunks += 1
        if chunk.usage is not None:
            got.usage = chunk.usage
        if chunk.choices and got.first is None:
            # vLLM's benchmark definition: the first chunk with a choice. Servers send it
            # once the first token exists; its text may be empty (a role, or a token the
            # detokenizer holds back), which must not count as a slow first token.
            got.first = time.perf_counter()
        got.parts.extend(c.delta.content for c in chunk.choices if c.delta.content)
    return got


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
    error = None
    try:
        # --timeout is per turn: the client's own bounds each read, and a server that
        # trickles its answer would never reach it.
        async with asyncio.timeout(settings.timeout_s):
            got = await _stream(client, model, messages, conversation, settings, extra)
    except openai.APIError as exc:
        error = _describe(exc)
    except TimeoutError:
        error = f"timeout: no whole answer within {settings.timeout_s:g} s"
    except httpx2.HTTPError as exc:  # raised while reading the stream, past the SDK
        error = safe_text(f"{type(exc).__name__}: {exc}")
    else:
        if got.chunks == 0:
            error = "no stream chunks in the answer: not an OpenAI-compatible endpoint?"
    if error is not None:
        return TurnRecord(conversation, turn, error=error), ""
    finished = time.perf_counter()
    details = getattr(got.usage, "prompt_tokens_details", None)
    record = TurnRecord(
        conversation,
        turn,
        ttft_s=None if got.first is None else got.first - started,
        latency_s=finished - started,
        prompt_tokens=getattr(got.usage, "prompt_tokens", None),
        completion_tokens=getattr(got.usage, "completion_tokens", None),
        cached_tokens=getattr(details, "cached_tokens", None),
    )
    # Servers may answer with nothing (EOS first); a placeholder keeps the history valid.
    return record, "".join(got.parts) or "."


def _describe(exc: openai.APIError) -> str:
    status = getattr(exc, "status_code", None)
    return f"http {status}: {exc.message}" if status else f"{type(exc).__name__}: {exc.message}"
